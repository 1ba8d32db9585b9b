// Shared prelude of every kernel file: prepended to each `.cu` source before NVRTC compiles it (the
// worker embeds both; see worker/src/backend/cuda/kernels.rs). No CUDA headers are included, so the sources
// compile with NVRTC alone on a machine without the CUDA toolkit. The prelude also compiles as host
// C++ behind a small shim (worker/tests/cuda_host.rs), which checks the weight decoders and the
// kernels that run under its emulated launch against the CPU backend without a GPU.
//
// Numeric modes (chosen at compile time):
//   exact (default): activations and KV cache in f32, f32 accumulation, compiled with --fmad=false so
//                    only explicit fmaf() fuses; every reduction has a fixed order (see each kernel).
//   fast (-DSMOLLM_FAST=1): activations and KV cache stored as bf16 (round to nearest even), f32
//                    accumulation, FMA contraction allowed.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define INFINITY __int_as_float(0x7f800000)

#ifdef SMOLLM_FAST
typedef u16 act_t;
__device__ __forceinline__ float ld_act(const act_t* p, i64 i) {
    return __uint_as_float(((u32)p[i]) << 16);
}
__device__ __forceinline__ void st_act(act_t* p, i64 i, float v) {
    u32 b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        p[i] = (u16)((b >> 16) | 0x40u);  // quiet NaN
    } else {
        p[i] = (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
}
#else
typedef float act_t;
__device__ __forceinline__ float ld_act(const act_t* p, i64 i) { return p[i]; }
__device__ __forceinline__ void st_act(act_t* p, i64 i, float v) { p[i] = v; }
#endif

// GGML type ids of the weight formats (gguf/src/ggml_type.rs).
#define FMT_F32 0
#define FMT_F16 1
#define FMT_Q4_0 2
#define FMT_Q4_1 3
#define FMT_Q5_0 6
#define FMT_Q5_1 7
#define FMT_Q8_0 8
#define FMT_Q4_K 12
#define FMT_Q5_K 13
#define FMT_Q6_K 14
#define FMT_BF16 30

// Elements per chunk: the unit of work of one lane in the matrix kernels and of the embedding lookup.
#define CHUNK 8

__device__ __forceinline__ float f16_to_f32(u16 h) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    // Host C++ build of this prelude (worker/tests/cuda_host.rs): the harness's exact
    // conversion.
    return host_f16_to_f32(h);
#endif
}

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 ld_u16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }

__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Bytes of one row of `k` elements in format FMT (k a multiple of 32 for Q4_0..Q8_0, of 256 for the
// k-quants; worker/src/backend/cuda/weights.rs::row_bytes checks this on the host).
__host__ __device__ __forceinline__ i64 row_bytes_of(int fmt, int k) {
    switch (fmt) {
        case FMT_F32: return 4ll * k;
        case FMT_F16:
        case FMT_BF16: return 2ll * k;
        case FMT_Q4_0: return (i64)(k / 32) * 18;
        case FMT_Q4_1: return (i64)(k / 32) * 20;
        case FMT_Q5_0: return (i64)(k / 32) * 22;
        case FMT_Q5_1: return (i64)(k / 32) * 24;
        case FMT_Q4_K: return (i64)(k / 256) * 144;
        case FMT_Q5_K: return (i64)(k / 256) * 176;
        case FMT_Q6_K: return (i64)(k / 256) * 210;
        default: return (i64)(k / 32) * 34;  // Q8_0
    }
}

// The 6-bit (scale, min) pair of sub-block j (0..8) of a Q4_K / Q5_K super-block from its 12 packed
// bytes (ggml's get_scale_min_k4, gguf/src/kquant.rs::scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Chunk c (elements 8c .. 8c+7) of a row of 32-element blocks in the 5-bit formats (Q5_0, Q5_1):
// element e of a block is the low (e < 16) or high (e >= 16) nibble of qs[e % 16] with bit e of the
// u32 qh as its fifth bit; Q5_0 (q - 16) * d, Q5_1 q * d + m (gguf/src/kquant.rs).
template <int FMT>
__device__ __forceinline__ void dequant_chunk_q5(const u8* __restrict__ row, int c, float w[CHUNK]) {
    const int blk = c >> 2, sub = c & 3;
    const u8* b = row + (i64)blk * (FMT == FMT_Q5_1 ? 24 : 22);
    const float d = f16_to_f32(ld_u16(b));
    const float m = FMT == FMT_Q5_1 ? f16_to_f32(ld_u16(b + 2)) : 0.0f;
    const u32 qh = ld_u32(b + (FMT == FMT_Q5_1 ? 4 : 2)) >> (sub * CHUNK);
    const u8* qs = b + (FMT == FMT_Q5_1 ? 8 : 6) + (sub & 1) * CHUNK;
    const int shift = (sub >> 1) * 4;
#pragma unroll
    for (int i = 0; i < CHUNK; i++) {
        const int q = ((qs[i] >> shift) & 0xF) | (((qh >> i) & 1u) << 4);
        w[i] = FMT == FMT_Q5_1 ? __fadd_rn(__fmul_rn((float)q, d), m) : __fmul_rn((float)(q - 16), d);
    }
}

// Chunk c of a row of 256-element Q4_K / Q5_K super-blocks. Element e of a super-block lies in chunk
// e / 64 of 64 values; its first 32 are the low nibbles of 32 bytes (sub-block 2 (e / 64)), the next
// 32 the high nibbles (sub-block 2 (e / 64) + 1); Q5_K takes bit j of qh[e % 32] (j the sub-block) as
// the fifth bit. x = (d * scale) * q - dmin * min, as gguf/src/kquant.rs (8 values of a chunk share one
// sub-block).
template <int FMT>
__device__ __forceinline__ void dequant_chunk_k45(const u8* __restrict__ row, int c, float w[CHUNK]) {
    const int blk = c >> 5, e0 = (c & 31) * CHUNK;
    const u8* b = row + (i64)blk * (FMT == FMT_Q5_K ? 176 : 144);
    const int ci = e0 >> 6, hi = (e0 >> 5) & 1, l0 = e0 & 31, j = 2 * ci + hi;
    int sc, mn;
    scale_min_k4(j, b + 4, &sc, &mn);
    const float dd = __fmul_rn(f16_to_f32(ld_u16(b)), (float)sc);
    const float mm = __fmul_rn(f16_to_f32(ld_u16(b + 2)), (float)mn);
    const u8* qs = b + (FMT == FMT_Q5_K ? 48 : 16) + 32 * ci + l0;
#pragma unroll
    for (int i = 0; i < CHUNK; i++) {
        int q = hi ? (qs[i] >> 4) : (qs[i] & 0xF);
        if (FMT == FMT_Q5_K) q |= ((b[16 + l0 + i] >> j) & 1) << 4;
        w[i] = __fsub_rn(__fmul_rn(dd, (float)q), mm);
    }
}

// Chunk c of a row of 256-element Q6_K super-blocks (ql[128] | qh[64] | scales[16] (i8) | f16 d).
// Half h = e / 128; within it quarter t = (e % 128) / 32 and l = e % 32: low 4 bits from the low
// (t < 2) or high (t >= 2) nibble of ql[64 h + 32 (t & 1) + l], high 2 bits from bits 2t, 2t + 1 of
// qh[32 h + l], scale scales[8 h + l / 16 + 2 t]; x = (d * scale) * (q - 32) (gguf/src/kquant.rs).
__device__ __forceinline__ void dequant_chunk_q6k(const u8* __restrict__ row, int c, float w[CHUNK]) {
    const int blk = c >> 5, e0 = (c & 31) * CHUNK;
    const u8* b = row + (i64)blk * 210;
    const int h = e0 >> 7, t = (e0 >> 5) & 3, l0 = e0 & 31;
    const u8* ql = b + 64 * h + 32 * (t & 1) + l0;
    const u8* qh = b + 128 + 32 * h + l0;
    const int nib = (t >> 1) * 4, hs = 2 * t;
    const signed char sc = (signed char)b[192 + 8 * h + (l0 >> 4) + 2 * t];
    const float s = __fmul_rn(f16_to_f32(ld_u16(b + 208)), (float)sc);
#pragma unroll
    for (int i = 0; i < CHUNK; i++) {
        const int q = (((ql[i] >> nib) & 0xF) | (((qh[i] >> hs) & 3) << 4)) - 32;
        w[i] = __fmul_rn(s, (float)q);
    }
}

// Decodes elements 8c .. 8c+7 of one row (`row` points at the row's first byte) into w[0..8], bitwise
// equal to gguf::dequantize (ggml's formulas, same f32 operations in the same order, no contraction):
// Q4_1 q*d+m, Q4_0 (q-8)*d, Q8_0 q*d, F16/BF16 widened, the 5-bit formats and k-quants above.
// In the 4-bit formats byte j of a block holds element j (low nibble) and j+16 (high nibble).
template <int FMT>
__device__ __forceinline__ void dequant_chunk(const u8* __restrict__ row, int c, float w[CHUNK]) {
    if (FMT == FMT_F32) {
        const float* p = (const float*)row + (i64)c * CHUNK;
#pragma unroll
        for (int i = 0; i < CHUNK; i++) w[i] = p[i];
    } else if (FMT == FMT_F16 || FMT == FMT_BF16) {
        const u16* p = (const u16*)row + (i64)c * CHUNK;
#pragma unroll
        for (int i = 0; i < CHUNK; i++) w[i] = FMT == FMT_F16 ? f16_to_f32(p[i]) : bf16_to_f32(p[i]);
    } else if (FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
        dequant_chunk_q5<FMT>(row, c, w);
    } else if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        dequant_chunk_k45<FMT>(row, c, w);
    } else if (FMT == FMT_Q6_K) {
        dequant_chunk_q6k(row, c, w);
    } else {
        const int blk = c >> 2, sub = c & 3;
        if (FMT == FMT_Q8_0) {
            const u8* b = row + (i64)blk * 34;
            const float d = f16_to_f32(ld_u16(b));
            const signed char* q = (const signed char*)(b + 2 + sub * CHUNK);
#pragma unroll
            for (int i = 0; i < CHUNK; i++) w[i] = __fmul_rn((float)q[i], d);
        } else {
            const int bpb = FMT == FMT_Q4_1 ? 20 : 18;
            const u8* b = row + (i64)blk * bpb;
            const float d = f16_to_f32(ld_u16(b));
            const float m = FMT == FMT_Q4_1 ? f16_to_f32(ld_u16(b + 2)) : 0.0f;
            const u8* qs = b + (FMT == FMT_Q4_1 ? 4 : 2) + (sub & 1) * CHUNK;
            const int shift = (sub >> 1) * 4;  // sub 0,1: low nibbles; 2,3: high nibbles
#pragma unroll
            for (int i = 0; i < CHUNK; i++) {
                const int q = (qs[i] >> shift) & 0xF;
                w[i] = FMT == FMT_Q4_1 ? __fadd_rn(__fmul_rn((float)q, d), m)
                                       : __fmul_rn((float)(q - 8), d);
            }
        }
    }
}

// Runtime-format variant of dequant_chunk (embedding lookup).
__device__ __forceinline__ void dequant_chunk_any(int fmt, const u8* row, int c, float w[CHUNK]) {
    switch (fmt) {
        case FMT_F32: dequant_chunk<FMT_F32>(row, c, w); break;
        case FMT_F16: dequant_chunk<FMT_F16>(row, c, w); break;
        case FMT_BF16: dequant_chunk<FMT_BF16>(row, c, w); break;
        case FMT_Q4_0: dequant_chunk<FMT_Q4_0>(row, c, w); break;
        case FMT_Q4_1: dequant_chunk<FMT_Q4_1>(row, c, w); break;
        case FMT_Q5_0: dequant_chunk<FMT_Q5_0>(row, c, w); break;
        case FMT_Q5_1: dequant_chunk<FMT_Q5_1>(row, c, w); break;
        case FMT_Q4_K: dequant_chunk<FMT_Q4_K>(row, c, w); break;
        case FMT_Q5_K: dequant_chunk<FMT_Q5_K>(row, c, w); break;
        case FMT_Q6_K: dequant_chunk<FMT_Q6_K>(row, c, w); break;
        default: dequant_chunk<FMT_Q8_0>(row, c, w); break;
    }
}

// Sum over the 32 lanes of a warp by a fixed butterfly (offsets 16, 8, 4, 2, 1). Every lane ends with
// the same value, and the order of additions depends on nothing but the lane values.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Block-wide sum of one value per thread through `scratch` (blockDim.x floats, blockDim.x a power of
// two): a fixed pairwise tree over thread ids. Every thread returns the total.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) scratch[threadIdx.x] = __fadd_rn(scratch[threadIdx.x], scratch[threadIdx.x + s]);
        __syncthreads();
    }
    const float total = scratch[0];
    __syncthreads();
    return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
        __syncthreads();
    }
    const float total = scratch[0];
    __syncthreads();
    return total;
}

// Soft-cap of one value, tanh(s / cap) * cap (worker/src/backend/cpu/attention/mod.rs::softcap_in_place);
// cap <= 0 means none (the value is returned unchanged).
__device__ __forceinline__ float softcap_score(float s, float cap) {
    return cap > 0.0f ? __fmul_rn(tanhf(__fdiv_rn(s, cap)), cap) : s;
}

// The first key a query at `pos` attends to: pos + 1 - window with a sliding window (window > 0),
// else 0 (worker/src/backend/cpu/attention/mod.rs::AttnOptions::keys).
__device__ __forceinline__ int first_key(int pos, int window) {
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

// Matrix-kernel epilogue: stores (or, with `accumulate`, adds to the existing value: the residual add)
// the finished dot product `v` at `idx` of the output, as f32 (`out_f32`, the logits) or as act_t.
__device__ __forceinline__ void store_out(void* out, int out_f32, i64 idx, float v, int accumulate) {
    if (out_f32) {
        float* p = (float*)out;
        p[idx] = accumulate ? __fadd_rn(p[idx], v) : v;
    } else {
        act_t* p = (act_t*)out;
        st_act(p, idx, accumulate ? __fadd_rn(ld_act(p, idx), v) : v);
    }
}
