// subprocess.h: a child process (`/bin/sh -c CMD`) with pipes on its stdin, stdout and stderr, for
// the user's reward workers (rl/tasks/reward_workers.h). The parent's ends are non-blocking, so a
// caller polls them together with a deadline and never hangs on a child that stopped reading or
// writing. The child is started with posix_spawn (no fork of a large, multithreaded trainer) in
// its own process group, so that killing it also kills what its shell started (a pipeline, a
// `python3 scorer.py`). The last bytes of its stderr are kept for error messages.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "rl/common.h"

extern char** environ;

namespace fp8rl {

class Subprocess {
public:
    static constexpr size_t kStderrTail = 2048;  // bytes of stderr kept for error messages

    // Starts `/bin/sh -c command`; a failure to start (no /bin/sh, out of processes) is an Error.
    explicit Subprocess(const std::string& command) : command_(command) {
        // A child that exits while we write to it must be an EPIPE we report, not a SIGPIPE that kills us.
        signal(SIGPIPE, SIG_IGN);
        int in[2], out[2], err[2];
        if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
            fail("cannot create pipes for '%s': %s", command.c_str(), strerror(errno));
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, in[0], 0);
        posix_spawn_file_actions_adddup2(&actions, out[1], 1);
        posix_spawn_file_actions_adddup2(&actions, err[1], 2);
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        sigset_t none, defaults;
        sigemptyset(&none);
        sigemptyset(&defaults);
        sigaddset(&defaults, SIGPIPE);  // ignored here; an ignored signal would stay ignored across exec
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setsigdefault(&attr, &defaults);
        posix_spawnattr_setpgroup(&attr, 0);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
        int rc = posix_spawn(&pid_, "/bin/sh", &actions, &attr, const_cast<char**>(argv), environ);
        posix_spawn_file_actions_destroy(&actions);
        posix_spawnattr_destroy(&attr);
        close(in[0]);
        close(out[1]);
        close(err[1]);
        stdin_ = in[1];
        stdout_ = out[0];
        stderr_ = err[0];
        if (rc != 0) {
            close_fds();
            pid_ = -1;
            fail("cannot start '/bin/sh -c %s': %s", command.c_str(), strerror(rc));
        }
        for (int fd : {stdin_, stdout_, stderr_}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }

    Subprocess(const Subprocess&) = delete;
    Subprocess& operator=(const Subprocess&) = delete;

    // Closes its stdin (a worker's cue to exit), waits up to grace_s, then kills its process group.
    ~Subprocess() { stop(0.5); }

    // Closes its stdin: a worker's cue to exit.
    void close_stdin() {
        if (stdin_ >= 0) {
            close(stdin_);
            stdin_ = -1;
        }
    }

    void stop(double grace_s) {
        close_stdin();
        if (pid_ > 0 && !reaped(grace_s)) {
            kill(-pid_, SIGKILL);
            kill(pid_, SIGKILL);
            waitpid(pid_, &status_, 0);
            exited_ = true;
        }
        close_fds();
    }

    int pid() const { return pid_; }
    int stdin_fd() const { return stdin_; }
    int stdout_fd() const { return stdout_; }
    int stderr_fd() const { return stderr_; }

    // Writes what the pipe takes now; returns the bytes written (0 when full). A child that is
    // gone (EPIPE) returns -1.
    ssize_t write_some(const char* data, size_t n) {
        ssize_t w = write(stdin_, data, n);
        if (w >= 0) return w;
        if (errno == EAGAIN || errno == EINTR) return 0;
        return -1;
    }

    // Appends what stdout holds now to `out`; false at end of file (the child closed it or exited).
    bool read_stdout(std::string& out) { return read_available(stdout_, &out); }

    // Keeps what stderr holds now in the tail.
    void drain_stderr() {
        std::string got;
        if (stderr_ >= 0 && !read_available(stderr_, &got)) {
            close(stderr_);
            stderr_ = -1;
        }
        tail_ += got;
        if (tail_.size() > kStderrTail) tail_.erase(0, tail_.size() - kStderrTail);
    }

    // "its stderr ends: ..." (one line: newlines shown as " | "), or that it wrote nothing.
    std::string stderr_tail() {
        drain_stderr();
        std::string t = tail_;
        while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
        if (t.empty()) return "it wrote nothing to stderr";
        std::string one;
        for (char c : t) one += c == '\n' ? std::string(" | ") : std::string(1, c);
        return "its stderr ends: " + one;
    }

    // How it ended, after waiting up to wait_s for it: "exited with status 3", "was killed by
    // signal 9", or "is still running".
    std::string how_it_ended(double wait_s) {
        if (!reaped(wait_s)) return "is still running";
        if (WIFEXITED(status_)) return strfmt("exited with status %d", WEXITSTATUS(status_));
        if (WIFSIGNALED(status_)) return strfmt("was killed by signal %d", WTERMSIG(status_));
        return "ended";
    }

private:
    std::string command_;
    pid_t pid_ = -1;
    int stdin_ = -1, stdout_ = -1, stderr_ = -1;
    int status_ = 0;
    bool exited_ = false;
    std::string tail_;

    bool reaped(double wait_s) {
        if (exited_ || pid_ <= 0) return true;
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
        for (;;) {
            pid_t r = waitpid(pid_, &status_, WNOHANG);
            if (r == pid_ || (r < 0 && errno != EINTR)) {
                exited_ = true;
                return true;
            }
            if (std::chrono::steady_clock::now() >= until) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }

    static bool read_available(int fd, std::string* out) {
        char buf[65536];
        for (;;) {
            ssize_t n = read(fd, buf, sizeof buf);
            if (n > 0) {
                out->append(buf, (size_t)n);
                continue;
            }
            if (n == 0) return false;
            return errno == EAGAIN || errno == EINTR;
        }
    }

    void close_fds() {
        for (int* fd : {&stdin_, &stdout_, &stderr_})
            if (*fd >= 0) {
                close(*fd);
                *fd = -1;
            }
    }
};

}  // namespace fp8rl
