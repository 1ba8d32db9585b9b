// Soft-capping of f32 values in place: x = tanh(x / cap) * cap (Gemma 2's final logit soft-cap), as
// worker/src/backend/cpu/ops.rs::softcap_in_place. Attention scores are capped inside the attention
// kernels with the same formula (softcap_score in common.cuh). Elementwise; grid-stride over n.
extern "C" __global__ void softcap(float* __restrict__ x, int n, float cap) {
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
        x[e] = softcap_score(x[e], cap);
}
