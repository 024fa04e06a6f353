// http_client.h: the least HTTP/1.1 that --reward_url needs: one POST of a JSON body per
// connection (Connection: close) over POSIX sockets, no TLS, no redirects, no keep-alive. The
// whole exchange (resolve, connect, send, receive) is bounded by one deadline, so a server that
// stops answering is an error after the timeout, never a hang. The response body is read by its
// Content-Length, as chunks (Transfer-Encoding: chunked), or up to the close.
#pragma once
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <string>

#include "rl/common.h"

namespace fp8rl {

struct HttpUrl {
    std::string host, port = "80", path = "/";
};

// http://host[:port][/path]; host may be a name, an IPv4 address or a [bracketed] IPv6 address.
inline HttpUrl parse_http_url(const std::string& url) {
    const std::string scheme = "http://";
    if (url.rfind("https://", 0) == 0)
        fail("%s: https is not supported (no TLS in fp8rl); serve the scorer over plain http, e.g. on 127.0.0.1", url.c_str());
    if (url.rfind(scheme, 0) != 0) fail("%s: expected a URL like http://127.0.0.1:5000/get_reward", url.c_str());
    HttpUrl u;
    std::string rest = url.substr(scheme.size());
    size_t slash = rest.find('/');
    std::string authority = rest.substr(0, slash);
    if (slash != std::string::npos) u.path = rest.substr(slash);
    if (!authority.empty() && authority[0] == '[') {
        size_t close = authority.find(']');
        if (close == std::string::npos) fail("%s: unclosed '[' in the host", url.c_str());
        u.host = authority.substr(1, close - 1);
        authority = authority.substr(close + 1);
        if (!authority.empty() && authority[0] != ':') fail("%s: expected ':port' after ']'", url.c_str());
        if (!authority.empty()) u.port = authority.substr(1);
    } else {
        size_t colon = authority.find(':');
        u.host = authority.substr(0, colon);
        if (colon != std::string::npos) u.port = authority.substr(colon + 1);
    }
    if (u.host.empty()) fail("%s: no host", url.c_str());
    if (u.port.empty() || u.port.find_first_not_of("0123456789") != std::string::npos || u.port.size() > 5)
        fail("%s: the port must be a number", url.c_str());
    return u;
}

struct HttpResponse {
    int status = 0;
    std::string body;
};

namespace http_detail {

using Clock = std::chrono::steady_clock;

inline int ms_left(Clock::time_point deadline) {
    double s = std::chrono::duration<double>(deadline - Clock::now()).count();
    return s <= 0 ? 0 : (int)std::ceil(s * 1000);
}

// Waits for `events` on fd until the deadline; false on timeout.
inline bool wait_for(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        int r = poll(&p, 1, ms_left(deadline));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

struct Socket {
    int fd = -1;
    ~Socket() {
        if (fd >= 0) close(fd);
    }
};

inline std::string lower(std::string s) {
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}

// The body of a chunked message; false while it is incomplete; an Error when malformed.
inline bool dechunk(const std::string& raw, std::string* body, const std::string& where) {
    body->clear();
    size_t pos = 0;
    for (;;) {
        size_t eol = raw.find("\r\n", pos);
        if (eol == std::string::npos) return false;
        std::string size_text = raw.substr(pos, eol - pos);
        size_text = size_text.substr(0, size_text.find(';'));
        char* end = nullptr;
        unsigned long long n = strtoull(size_text.c_str(), &end, 16);
        if (size_text.empty() || (end && *end != '\0' && *end != ' ')) fail("%s: malformed chunk size '%s'", where.c_str(), size_text.c_str());
        pos = eol + 2;
        if (n == 0) return true;  // trailers, if any, are not needed
        if (raw.size() < pos + n + 2) return false;
        body->append(raw, pos, n);
        pos += n + 2;
    }
}

}  // namespace http_detail

// POSTs `body` as application/json to url; any status comes back (the caller judges it). Failing
// to connect, a malformed response or the deadline (timeout_s from now) is an Error naming the URL.
inline HttpResponse http_post_json(const std::string& url, const std::string& body, double timeout_s) {
    using namespace http_detail;
    const HttpUrl u = parse_http_url(url);
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    if (int rc = getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &addrs); rc != 0)
        fail("%s: cannot resolve host '%s': %s", url.c_str(), u.host.c_str(), gai_strerror(rc));
    Socket s;
    std::string why = "no address";
    for (addrinfo* a = addrs; a && s.fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            if (!wait_for(fd, POLLOUT, deadline)) {
                close(fd);
                freeaddrinfo(addrs);
                fail("%s: no connection within %g s (--reward_timeout)", url.c_str(), timeout_s);
            }
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err ? -1 : 0;
            errno = err;
        }
        if (rc == 0) s.fd = fd;
        else {
            why = strerror(errno);
            close(fd);
        }
    }
    freeaddrinfo(addrs);
    if (s.fd < 0) fail("%s: cannot connect: %s; is the reward server running?", url.c_str(), why.c_str());

    std::string request = "POST " + u.path + " HTTP/1.1\r\nHost: " + u.host + ":" + u.port +
                          "\r\nContent-Type: application/json\r\nAccept: application/json\r\nConnection: close\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
    for (size_t sent = 0; sent < request.size();) {
        if (!wait_for(s.fd, POLLOUT, deadline)) fail("%s: the request was not taken within %g s (--reward_timeout)", url.c_str(), timeout_s);
        ssize_t n = send(s.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) fail("%s: sending the request failed: %s", url.c_str(), strerror(errno));
        if (n > 0) sent += (size_t)n;
    }

    std::string raw;
    size_t header_end = std::string::npos;
    HttpResponse r;
    long long content_length = -1;
    bool chunked = false;
    for (;;) {
        if (header_end != std::string::npos) {
            const std::string payload = raw.substr(header_end);
            if (chunked && dechunk(payload, &r.body, url)) return r;
            if (!chunked && content_length >= 0 && (long long)payload.size() >= content_length) {
                r.body = payload.substr(0, (size_t)content_length);
                return r;
            }
        }
        if (!wait_for(s.fd, POLLIN, deadline)) fail("%s: no complete response within %g s (--reward_timeout)", url.c_str(), timeout_s);
        char buf[65536];
        ssize_t n = recv(s.fd, buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            fail("%s: receiving the response failed: %s", url.c_str(), strerror(errno));
        }
        if (n == 0) {  // the server closed the connection
            if (header_end == std::string::npos) fail("%s: the server closed the connection without a complete response", url.c_str());
            if (chunked || content_length >= 0) fail("%s: the server closed the connection before the body's end", url.c_str());
            r.body = raw.substr(header_end);
            return r;
        }
        raw.append(buf, (size_t)n);
        if (header_end == std::string::npos) {
            size_t at = raw.find("\r\n\r\n");
            if (at == std::string::npos) continue;
            header_end = at + 4;
            const std::string head = raw.substr(0, at);
            if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) fail("%s: not an HTTP/1.x response: '%.80s'", url.c_str(), head.c_str());
            r.status = atoi(head.c_str() + 9);
            for (size_t pos = head.find("\r\n"); pos != std::string::npos;) {
                size_t eol = head.find("\r\n", pos + 2);
                std::string line = head.substr(pos + 2, eol == std::string::npos ? std::string::npos : eol - pos - 2);
                pos = eol;
                size_t colon = line.find(':');
                if (colon == std::string::npos) continue;
                std::string name = lower(line.substr(0, colon)), value = line.substr(colon + 1);
                value.erase(0, value.find_first_not_of(" \t"));
                if (name == "content-length") content_length = atoll(value.c_str());
                if (name == "transfer-encoding" && lower(value).find("chunked") != std::string::npos) chunked = true;
            }
        }
    }
}

}  // namespace fp8rl
