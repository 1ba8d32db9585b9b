// Host stand-ins for the CUDA names of the kernels' math (worker/tests/cuda_host*.rs): the
// intrinsics become plain IEEE operations (compile with -ffp-contract=off), the f16 conversion an
// exact software one. Thread and launch emulation: serial.h or threaded.h.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#define __device__
#define __host__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
#define __global__
#define __launch_bounds__(...)
// IEEE binary16 to binary32, exact (every f16 is an f32).
static inline float host_f16_to_f32(unsigned short h) {
    const unsigned s = (h >> 15) & 1u, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = __uint_as_float(0x7f800000u | (m << 13));
    else v = __uint_as_float(((e + 112u) << 23) | (m << 13));
    return s ? -v : v;
}
#undef INFINITY
