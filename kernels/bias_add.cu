// Bias of a projection: x[r, i] += bias[i] for the n_rows rows of a `width`-wide activation (Qwen 2's
// Q/K/V biases, added to the fused QKV output before the q/k norms and RoPE, as the CPU forward pass
// does). Elementwise; grid-stride over n_rows * width elements.
extern "C" __global__ void bias_add(act_t* __restrict__ x, const float* __restrict__ bias, int n_rows, int width) {
    const i64 total = (i64)n_rows * width;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x)
        st_act(x, e, __fadd_rn(ld_act(x, e), bias[e % width]));
}
