// SwiGLU: out[r, i] = silu(g) * u with g = gate_up[r, i], u = gate_up[r, ffn + i] (gate half first) and
// silu(g) = g / (1 + e^-g), as worker/src/model/ops.rs::swiglu. Elementwise; grid-stride over
// n_rows * ffn elements.
extern "C" __global__ void swiglu(const act_t* __restrict__ gate_up, int n_rows, int ffn, act_t* __restrict__ out) {
    const i64 total = (i64)n_rows * ffn;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 r = e / ffn, i = e % ffn;
        const float g = ld_act(gate_up, r * 2 * ffn + i), u = ld_act(gate_up, r * 2 * ffn + ffn + i);
        st_act(out, e, __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u));
    }
}
