/* A decoder layer's row-wise operations, each in one pass over its rows, on the CPU.
 *
 * transformers writes an RMS norm as six tensor operations (square, mean, add, rsqrt,
 * two products) and a SiLU-gated MLP's middle as two (silu, product), each a pass over
 * memory and a dispatch of its own; at a decode step of a small model each of those
 * passes is a few microseconds of work behind tens of microseconds of overhead, and on
 * a 2-core machine torch runs them on one core. Here each is one loop over the rows.
 *
 * Rows are split among threads only when there are enough of them to pay for starting
 * a thread (prefill-sized inputs); threads take chunks of rows from a shared counter,
 * as the attention kernel's do, so a thread that loses its core holds up no other.
 *
 * Built with paged_decode.c into one library by tokenfair.engine.hf.cpu_kernels; float32.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "vec.h"

#define MAX_THREADS 256
#define CHUNK_ROWS 32
/* Below this many elements one thread does the whole job: starting another costs more. */
#define PARALLEL_ELEMENTS (1 << 18)

typedef void (*RowsFn)(const void *job, int64_t begin, int64_t end);

typedef struct {
    RowsFn rows_fn;
    const void *job;
    int64_t rows, next;
} Rows;

static void *take_rows(void *arg) {
    Rows *rows = (Rows *)arg;
    for (;;) {
        const int64_t begin = __atomic_fetch_add(&rows->next, CHUNK_ROWS, __ATOMIC_RELAXED);
        if (begin >= rows->rows) break;
        const int64_t end = begin + CHUNK_ROWS < rows->rows ? begin + CHUNK_ROWS : rows->rows;
        rows->rows_fn(rows->job, begin, end);
    }
    return NULL;
}

/* Run rows_fn over [0, rows), on up to `threads` threads when the job is big enough. */
static void for_rows(RowsFn rows_fn, const void *job, int64_t rows, int64_t width, int threads) {
    if (rows * width < PARALLEL_ELEMENTS || threads <= 1 || rows <= CHUNK_ROWS) {
        rows_fn(job, 0, rows);
        return;
    }
    const int64_t chunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > chunks) threads = (int)chunks;
    Rows work = {rows_fn, job, rows, 0};
    pthread_t workers[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < threads; ++t)
        started[t] = pthread_create(&workers[t], NULL, take_rows, &work) == 0;
    take_rows(&work); /* the calling thread works too, and ends the job alone if none started */
    for (int t = 1; t < threads; ++t)
        if (started[t]) pthread_join(workers[t], NULL);
}

/* --- RMS norm: out = weight * (x / sqrt(mean(x^2) + eps)) --------------------------- */

typedef struct {
    const float *x, *weight;
    float *out;
    int64_t x_stride, out_stride;
    int dim;
    float eps;
} Norm;

static void rms_norm_rows(const void *job, int64_t begin, int64_t end) {
    const Norm *n = (const Norm *)job;
    const int d = n->dim, wide = d - d % 8;
    for (int64_t r = begin; r < end; ++r) {
        const float *x = n->x + r * n->x_stride;
        float *out = n->out + r * n->out_stride;
        v8 acc0 = {0}, acc1 = {0};
        int i = 0;
        for (; i + 16 <= wide; i += 16) {
            const v8 a = load8(x + i), b = load8(x + i + 8);
            acc0 += a * a;
            acc1 += b * b;
        }
        if (i < wide) {
            const v8 a = load8(x + i);
            acc0 += a * a;
        }
        float squares = hsum8(acc0 + acc1);
        for (i = wide; i < d; ++i) squares += x[i] * x[i];
        /* As transformers rounds it: the normalised value first, then the weight. */
        const float inv = 1.0f / sqrtf(squares / (float)d + n->eps);
        for (i = 0; i < wide; i += 8) store8(out + i, load8(n->weight + i) * (load8(x + i) * inv));
        for (i = wide; i < d; ++i) out[i] = n->weight[i] * (x[i] * inv);
    }
}

void tokenfair_rms_norm(const float *x, int64_t x_stride, const float *weight, float *out,
                        int64_t out_stride, int64_t rows, int dim, float eps, int threads) {
    const Norm job = {x, weight, out, x_stride, out_stride, dim, eps};
    for_rows(rms_norm_rows, &job, rows, dim, threads);
}

/* --- SiLU-gated product: out = silu(gate) * up ---------------------------------------- */

typedef struct {
    const float *gate, *up;
    float *out;
    int64_t gate_stride, up_stride, out_stride;
    int width;
} Gated;

static void silu_and_mul_rows(const void *job, int64_t begin, int64_t end) {
    const Gated *g = (const Gated *)job;
    const int w = g->width, wide = w - w % 8;
    for (int64_t r = begin; r < end; ++r) {
        const float *gate = g->gate + r * g->gate_stride, *up = g->up + r * g->up_stride;
        float *out = g->out + r * g->out_stride;
        for (int i = 0; i < wide; i += 8) {
            const v8 x = load8(gate + i);
            store8(out + i, x / (1.0f + exp8(-x)) * load8(up + i));
        }
        for (int i = wide; i < w; ++i) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

void tokenfair_silu_and_mul(const float *gate, int64_t gate_stride, const float *up,
                            int64_t up_stride, float *out, int64_t out_stride, int64_t rows,
                            int width, int threads) {
    const Gated job = {gate, up, out, gate_stride, up_stride, out_stride, width};
    for_rows(silu_and_mul_rows, &job, rows, width, threads);
}

/* --- Rotary position embedding, rotate-half form ---------------------------------------
 * out = x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x[half:], x[:half]):
 * for every token, every head of x (read through strides: the model's view of its
 * projection, as it is) against that token's cos and sin rows. out is [tokens, heads, dim]. */

typedef struct {
    const float *x, *cos, *sin;
    float *out;
    int64_t token_stride, head_stride, angle_stride;
    int heads, dim;
} Rotary;

static void rotary_rows(const void *job, int64_t begin, int64_t end) {
    const Rotary *ro = (const Rotary *)job;
    const int half = ro->dim / 2;
    for (int64_t t = begin; t < end; ++t) {
        const float *cos = ro->cos + t * ro->angle_stride, *sin = ro->sin + t * ro->angle_stride;
        for (int h = 0; h < ro->heads; ++h) {
            const float *x = ro->x + t * ro->token_stride + h * ro->head_stride;
            float *out = ro->out + (t * ro->heads + h) * (int64_t)ro->dim;
            int i = 0;
            for (; i + 8 <= half; i += 8) {
                const v8 a = load8(x + i), b = load8(x + half + i);
                store8(out + i, a * load8(cos + i) + -b * load8(sin + i));
                store8(out + half + i, b * load8(cos + half + i) + a * load8(sin + half + i));
            }
            for (; i < half; ++i) {
                out[i] = x[i] * cos[i] + -x[half + i] * sin[i];
                out[half + i] = x[half + i] * cos[half + i] + x[i] * sin[half + i];
            }
        }
    }
}

void tokenfair_rotary(const float *x, int64_t token_stride, int64_t head_stride, const float *cos,
                      const float *sin, int64_t angle_stride, float *out, int64_t tokens,
                      int heads, int dim, int threads) {
    const Rotary job = {x, cos, sin, out, token_stride, head_stride, angle_stride, heads, dim};
    for_rows(rotary_rows, &job, tokens, (int64_t)heads * dim, threads);
}
