// test_decode_slots.cu: cuda/rollout/decode_slots.cuh's refill (decode_refill_kernel, one warp over the
// rows 32 at a time) against its rule written as the plain walk it documents: in row order, each row
// whose slot draws no more takes the next standby slot from run->next on that still draws, skipping
// those that do not; the taken slot's page table row is copied to the row's, its row recorded, the
// row's cascade mark cleared; run->next ends past the last slot taken (or at the end when the
// standby slots ran out). On random cases from 1 to 100 rows and 0 to 100 standby slots, with
// stopped rows and dead standby slots at every density, so rounds end both ways (rows served,
// slots used up) and within and across the warp's 32.
#include <cstdio>
#include <vector>

#include "cuda/rollout/decode_slots.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

struct RefillCase {
    std::vector<DecodeSlot> slots;  // [2S]: rows' slots, then standby slots
    std::vector<int32_t> row_slot, table, shared;
    DecodeRun run{};
};

// The rule, row by row.
void refill_on_host(RefillCase& c, int rows, int max_pages, int first_standby) {
    int next = c.run.next;
    const int end = first_standby + c.run.standby;
    for (int r = 0; r < rows && next < end; r++) {
        if (c.slots[(size_t)c.row_slot[(size_t)r]].remaining > 0) continue;
        while (next < end && c.slots[(size_t)next].remaining <= 0) next++;
        if (next == end) break;
        c.row_slot[(size_t)r] = next;
        c.slots[(size_t)next].row = r;
        for (int p = 0; p < max_pages; p++) c.table[(size_t)r * max_pages + p] = c.table[(size_t)next * max_pages + p];
        c.shared[(size_t)r] = 0;
        next++;
    }
    c.run.next = next;
}

bool same_slots(const std::vector<DecodeSlot>& a, const std::vector<DecodeSlot>& b) {
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].remaining != b[i].remaining || a[i].row != b[i].row) return false;
    return a.size() == b.size();
}

}  // namespace

TEST(decode_refill_kernel_is_the_row_order_rule) {
    REQUIRE_GPU();
    const int cases = 300, max_pages = 3;
    int agreed = 0, taken = 0, across_32 = 0;
    for (int t = 0; t < cases; t++) {
        auto u = [&](int i) { return (hash_uniform(i, 7000u + (uint32_t)t) + 1.0f) * 0.5f; };  // [0, 1]
        const int S = 1 + (int)(u(0) * 99.99f), rows = 1 + (int)(u(1) * (S - 0.01f)),
                  standby = (int)(u(2) * (S + 0.99f)) % (S + 1);
        const float stop_p = u(3), live_p = u(4);
        RefillCase c;
        c.slots.assign(2 * (size_t)S, DecodeSlot{0, 0, 0, 0, 0u, -1, 0, -1});
        for (int s = 0; s < 2 * S; s++) {
            const bool live = s < S ? u(10 + s) >= stop_p : u(10 + s) < live_p;
            c.slots[(size_t)s].remaining = live ? 1 + s % 5 : 0;
            c.slots[(size_t)s].row = s < S ? s : -1;
        }
        for (int r = 0; r < S; r++) c.row_slot.push_back(r);
        for (int i = 0; i < 2 * S * max_pages; i++) c.table.push_back(1000 + i);
        c.shared.assign((size_t)S, 1);
        c.run = DecodeRun{1u, standby, S + (int)(u(5) * 3.0f) % (standby + 1), 0};  // sometimes past the first slots
        RefillCase want = c;
        refill_on_host(want, rows, max_pages, S);

        DeviceBuffer<DecodeSlot> slots(c.slots);
        DeviceBuffer<int32_t> row_slot(c.row_slot), table(c.table), shared(c.shared);
        DeviceBuffer<DecodeRun> run(std::vector<DecodeRun>{c.run});
        decode_refill_gpu(slots.ptr, row_slot.ptr, rows, run.ptr, table.ptr, max_pages, shared.ptr, S, 0);
        const bool ok = same_slots(slots.download(), want.slots) && row_slot.download() == want.row_slot &&
                        table.download() == want.table && shared.download() == want.shared &&
                        run.download()[0].next == want.run.next;
        agreed += ok;
        CHECK_MSG(ok, "case %d: %d rows, %d standby slots from %d: the kernel's refill is not the rule's", t, rows, standby,
                  c.run.next - S);
        for (int r = 0; r < rows; r++) {
            taken += want.row_slot[(size_t)r] != r;
            across_32 += r >= 32 && want.row_slot[(size_t)r] != r;
        }
    }
    printf("    %d of %d cases as the rule: %d rows refilled, %d of them past the first 32 rows\n", agreed, cases, taken,
           across_32);
    CHECK(taken > 0 && across_32 > 0);
}
