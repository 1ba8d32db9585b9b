// Gated feed-forward activations: out[r, i] = act(g) * u with g = gate_up[r, i], u = gate_up[r, ffn + i]
// (gate half first), as worker/src/backend/cpu/ops.rs::gated_into, with the same f32 operations in the
// same order:
//   swiglu: act(g) = g / (1 + e^-g)                                   (SiLU, Shazeer 2020)
//   geglu:  act(g) = g / (1 + e^z), z = -2 (β (g + κ g³)), β = sqrt(2/π), κ = 0.044715
//           (the tanh GELU, 0.5 g (1 + tanh(β (g + κ g³))), written with one exponential).
// Elementwise; grid-stride over n_rows * ffn elements.

// The exponent z of the tanh GELU, as worker/src/backend/cpu/ops.rs::gelu_exponent ((g * g) * g first).
__device__ __forceinline__ float gelu_exponent(float g) {
    const float beta = 0.7978846f, kappa = 0.044715f;
    return __fmul_rn(-2.0f, __fmul_rn(beta, __fadd_rn(g, __fmul_rn(kappa, __fmul_rn(__fmul_rn(g, g), g)))));
}

template <bool GELU>
__device__ __forceinline__ void gated_body(const act_t* __restrict__ gate_up, int n_rows, int ffn,
                                           act_t* __restrict__ out) {
    const i64 total = (i64)n_rows * ffn;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 r = e / ffn, i = e % ffn;
        const float g = ld_act(gate_up, r * 2 * ffn + i), u = ld_act(gate_up, r * 2 * ffn + ffn + i);
        const float z = GELU ? gelu_exponent(g) : -g;
        st_act(out, e, __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(z))), u));
    }
}

extern "C" __global__ void swiglu(const act_t* __restrict__ gate_up, int n_rows, int ffn, act_t* __restrict__ out) {
    gated_body<false>(gate_up, n_rows, ffn, out);
}

extern "C" __global__ void geglu(const act_t* __restrict__ gate_up, int n_rows, int ffn, act_t* __restrict__ out) {
    gated_body<true>(gate_up, n_rows, ffn, out);
}
