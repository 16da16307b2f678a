/* Eight floats at a time, for the CPU kernels: GCC/Clang vector extensions (one AVX
 * register, two NEON ones) keep the code portable. The unaligned, may_alias loads and
 * stores read and write rows wherever they lie. */
#ifndef TOKENFAIR_VEC_H
#define TOKENFAIR_VEC_H

#include <stdint.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 load8(const float *at) { return *(const v8u *)at; }
static inline void store8(float *at, v8 x) { *(v8u *)at = x; }
static inline float hsum8(v8 x) {
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

/* e^x for eight floats at once: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' expf
 * polynomial, 2^n put straight into the exponent bits. Within 2 ulp of expf on
 * [-87, 88]; beyond, the input is clamped there (so e^x for x < -87 is about 1.6e-38,
 * not 0: nothing here adds such a term to anything that large). */
static inline v8 exp8(v8 x) {
    const v8 lo = {-87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f};
    const v8 hi = {88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f};
    const v8i below = x < lo, above = x > hi;
    x = (v8)(((v8i)x & ~below) | ((v8i)lo & below));
    x = (v8)(((v8i)x & ~above) | ((v8i)hi & above));
    /* round(x / ln2) by the 1.5 * 2^23 trick: exact for |x / ln2| < 2^22 */
    const v8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const v8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    v8 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const v8i scale = (__builtin_convertvector(n, v8i) + 127) << 23;
    return p * (v8)scale;
}

#endif
