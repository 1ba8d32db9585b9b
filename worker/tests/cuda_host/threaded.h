// Launch emulation of worker/tests/cuda_host.rs: one OS thread per CUDA thread of a block, __syncthreads a barrier over the block, a warp shuffle an exchange through per-warp slots
// between two barriers over the warp's 32 threads, dynamic shared memory one array per block. Blocks
// run one after the other. Every thread of a block must reach every barrier (as on the GPU).
#include <barrier>
#include <thread>
struct HostDim { unsigned x, y; };
static thread_local HostDim threadIdx{0, 0};
static HostDim blockDim{1, 1}, blockIdx{0, 0}, gridDim{1, 1};
static std::barrier<>* host_block_barrier;
static std::barrier<>* host_warp_barrier[32];
static float host_warp_slots[32][32];
#define __shared__
float smem[1 << 16];
static inline void __syncthreads() { host_block_barrier->arrive_and_wait(); }
static inline float host_exchange(float v, unsigned from_lane_xor, unsigned from_lane, bool use_xor) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    host_warp_slots[w][l] = v;
    host_warp_barrier[w]->arrive_and_wait();
    const float r = host_warp_slots[w][use_xor ? (l ^ from_lane_xor) : from_lane];
    host_warp_barrier[w]->arrive_and_wait();
    return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int off) { return host_exchange(v, off, 0, true); }
static inline float __shfl_sync(unsigned, float v, int lane) { return host_exchange(v, 0, lane, false); }
// A kernel launch over a 2-D grid of 1-D blocks of `block` threads (a multiple of 32).
template <class F> static void host_launch(unsigned gx, unsigned gy, unsigned block, F f) {
    gridDim = {gx, gy};
    blockDim = {block, 1};
    std::barrier<> bb(block);
    host_block_barrier = &bb;
    std::vector<std::barrier<>*> wb;
    for (unsigned w = 0; w < block / 32; w++) wb.push_back(host_warp_barrier[w] = new std::barrier<>(32));
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x = 0; x < gx; x++) {
            blockIdx = {x, y};
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < block; t++)
                threads.emplace_back([t, &f] { threadIdx = {t, 0}; f(); });
            for (auto& th : threads) th.join();
        }
    for (auto* b : wb) delete b;
}
