// Serial launch emulation (worker/tests/cuda_host.rs): every thread of a block runs to completion
// in turn, so only kernels without barriers or warp exchanges other than lane 0's broadcast run here.
static inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
struct HostDim { unsigned x; };
static HostDim threadIdx{0}, blockDim{1}, blockIdx{0}, gridDim{1};
// __shfl_sync(mask, v, 0) under the serial launch: lane 0 of a warp runs first and records each value
// it broadcasts; the other lanes of that warp read them back in the same order.
static std::vector<float> host_bcast[64];
static size_t host_bcast_at[2048];
static inline float __shfl_sync(unsigned, float v, int) {
    const unsigned warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) { host_bcast[warp].push_back(v); return v; }
    return host_bcast[warp][host_bcast_at[threadIdx.x]++];
}
// A kernel launch: every thread of every block in turn.
template <class F> static void host_launch(unsigned grid, unsigned block, F f) {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; b++) {
        for (auto& v : host_bcast) v.clear();
        for (auto& a : host_bcast_at) a = 0;
        blockIdx.x = b;
        for (unsigned t = 0; t < block; t++) { threadIdx.x = t; f(); }
    }
}
static inline void __syncthreads() {}
