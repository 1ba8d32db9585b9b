/* Physical floors for BENCHMARKS.md, on this machine and all its cores (OpenMP-free: one pthread per core).
 *   memory bandwidth: read+write of a 512 MiB f32 buffer pair (copy loop), GB/s counted as bytes read + written;
 *   f32 FMA peak: 2 threads, each 12 independent 8- or 16-wide FMA chains in registers, GFLOP/s (2 flops per lane).
 * Build: gcc -O3 -march=native -pthread bench/floors.c -o floors   Usage: ./floors [threads]
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define N (64u << 20) /* floats per buffer: 256 MiB */
static float *src, *dst;
static int threads = 2;

static void *copy_part(void *arg) {
    size_t id = (size_t)arg, part = N / threads;
    memcpy(dst + id * part, src + id * part, part * sizeof(float));
    return NULL;
}

#define ITERS 200000000L
static void *fma_part(void *arg) {
    (void)arg;
#ifdef __AVX512F__
    __m512 a[12], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < ITERS / 16; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    static volatile float sink;
    sink = _mm512_reduce_add_ps(s);
#else
    __m256 a[12], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < ITERS / 8; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    static volatile float sink;
    float o[8];
    _mm256_storeu_ps(o, a[0]);
    sink = o[0];
#endif
    return NULL;
}

static double run(void *(*f)(void *)) {
    pthread_t t[64];
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, f, (void *)(size_t)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc > 1) threads = atoi(argv[1]);
    src = aligned_alloc(64, N * sizeof(float));
    dst = aligned_alloc(64, N * sizeof(float));
    for (size_t i = 0; i < N; i++) src[i] = (float)i, dst[i] = 0;
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double s = run(copy_part);
        if (s < best) best = s;
    }
    printf("copy bandwidth: %.1f GB/s (read + write, best of 5, %d threads)\n",
           2.0 * N * sizeof(float) / best / 1e9, threads);
    best = 1e9;
    for (int r = 0; r < 3; r++) {
        double s = run(fma_part);
        if (s < best) best = s;
    }
#ifdef __AVX512F__
    const int lanes = 16;
#else
    const int lanes = 8;
#endif
    double flops = (double)threads * (ITERS / lanes) * 12 * lanes * 2;
    printf("f32 FMA peak: %.1f GFLOP/s (%d-wide, %d threads, best of 3)\n", flops / best / 1e9, lanes, threads);
    return 0;
}
