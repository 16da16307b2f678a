/* Single-query attention read straight out of the paged KV pool, on the CPU.
 *
 * One call attends every decoding request of a step for one layer. For each request
 * and each KV head, the keys of its context are read once, block by block from the
 * pool (no copy of the context is made), scored against every query head that shares
 * that KV head (grouped-query attention), soft-maxed, and the values are summed with
 * those weights. Threads take the work items (request, KV head) one at a time from a
 * shared counter, so a thread that loses its core to another process holds up no
 * other thread's share (a static split would wait for the slowest thread).
 *
 * Pool layout, per layer: keys[kv_head][slot][head_dim], values likewise, where
 * slot = block * block_size + offset. Queries are read through strides, so the
 * model's own [heads, tokens, head_dim] view is used as it is.
 *
 * Built by tokenfair.engine.hf.cpu_kernels with the machine's C compiler; float32.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

#define MAX_THREADS 256

typedef struct {
    const float *query;        /* query[r * q_row_stride + h * q_head_stride + d] */
    const float *keys;         /* keys[kh * kv_head_stride + slot * head_dim + d] */
    const float *values;
    const int64_t *tables;     /* tables[r * table_stride + i]: the i-th block of request r */
    const int64_t *lens;       /* lens[r]: context length, the new token included */
    float *out;                /* out[(r * heads + h) * head_dim + d] */
    int64_t q_row_stride, q_head_stride, kv_head_stride, table_stride;
    int heads, kv_heads, head_dim, block_size, window;
    float scale;
} Problem;

typedef struct {
    const Problem *p;
    int64_t items, longest; /* items are r * kv_heads + kh; longest context */
    int64_t next;           /* the next item to take, shared by the threads */
    int failed;
} Work;

/* q . k for `count` keys laid out one after another (a run inside one block). */
static inline void score_run(const float *restrict q, const float *restrict k, int64_t count,
                             const int d, float scale, float *restrict out) {
    const int wide = d - d % 8;
    for (int64_t t = 0; t < count; ++t, k += d) {
        v8 acc0 = {0}, acc1 = {0};
        int i = 0;
        for (; i + 16 <= wide; i += 16) {
            acc0 += load8(q + i) * load8(k + i);
            acc1 += load8(q + i + 8) * load8(k + i + 8);
        }
        if (i < wide) acc0 += load8(q + i) * load8(k + i);
        float s = hsum8(acc0 + acc1);
        for (i = wide; i < d; ++i) s += q[i] * k[i];
        out[t] = s * scale;
    }
}

/* o += sum_t weights[t] * v_t over a run of `count` values, reading each row in order
 * (the prefetcher follows rows; columns strided by a row would miss on every load),
 * with up to 64 floats of o held in registers at a time. */
static inline void accumulate_run(float *restrict o, const float *restrict weights,
                                  const float *restrict v, int64_t count, const int d) {
    const int wide = d - d % 8;
    for (int part = 0; part < wide; part += 64) {
        const int lanes = (wide - part) / 8 < 8 ? (wide - part) / 8 : 8;
        v8 acc[8];
        for (int u = 0; u < lanes; ++u) acc[u] = load8(o + part + 8 * u);
        const float *row = v + part;
        for (int64_t t = 0; t < count; ++t, row += d) {
            const float w = weights[t];
            for (int u = 0; u < lanes; ++u) acc[u] += w * load8(row + 8 * u);
        }
        for (int u = 0; u < lanes; ++u) store8(o + part + 8 * u, acc[u]);
    }
    for (int i = wide; i < d; ++i) {
        float acc = o[i];
        for (int64_t t = 0; t < count; ++t) acc += weights[t] * v[t * d + i];
        o[i] = acc;
    }
}

/* Ask for a run of rows ahead of use: blocks lie anywhere in the pool, so the hardware
 * prefetcher cannot guess where the next one starts. */
static inline void prefetch_run(const float *at, int64_t count, const int d) {
    const char *byte = (const char *)at, *end = (const char *)(at + count * d);
    for (; byte < end; byte += 64) __builtin_prefetch(byte, 0, 3);
}

/* The rows of positions [pos, pos + *count) of one head, which lie in one block: the
 * rest of pos's block, or up to `len`. The next block is prefetched meanwhile. */
static inline const float *block_run(const float *base, const int64_t *table, int64_t pos,
                                     int64_t len, int bs, const int d, int64_t *count) {
    const int64_t offset = pos % bs;
    *count = (len - pos < bs - offset) ? len - pos : bs - offset;
    if (pos + *count < len) prefetch_run(base + table[(pos + *count) / bs] * bs * d, bs, d);
    return base + (table[pos / bs] * bs + offset) * d;
}

/* One request, one KV head: the `group` query heads that read it. `d` is a constant
 * in the common specialisations below, so the compiler unrolls the head_dim loops. */
static inline __attribute__((always_inline)) void attend_body(
    const Problem *p, int64_t r, int kh, float *restrict scores, float *restrict acc, const int d) {
    const int group = p->heads / p->kv_heads, bs = p->block_size;
    const int64_t len = p->lens[r];
    const int64_t first = (p->window > 0 && len > p->window) ? len - p->window : 0;
    const int64_t n = len - first;
    float *out = p->out + (r * p->heads + (int64_t)kh * group) * d;
    if (n <= 0) { /* nothing to attend to: a zero output, as an empty weighted sum */
        memset(out, 0, sizeof(float) * group * d);
        return;
    }
    const int64_t *table = p->tables + r * p->table_stride;
    const float *kbase = p->keys + (int64_t)kh * p->kv_head_stride;
    const float *vbase = p->values + (int64_t)kh * p->kv_head_stride;
    const float *qbase = p->query + r * p->q_row_stride + (int64_t)kh * group * p->q_head_stride;

    /* Scores, block by block (a block's keys stay in L1 across the group's heads). */
    int64_t count;
    for (int64_t pos = first; pos < len; pos += count) {
        const float *k = block_run(kbase, table, pos, len, bs, d, &count);
        for (int g = 0; g < group; ++g)
            score_run(qbase + g * p->q_head_stride, k, count, d, p->scale,
                      scores + g * n + (pos - first));
    }
    /* Softmax weights per head (the exponentials eight at a time: a scalar expf per
     * position and head was a tenth of the kernel's time). */
    float total[group];
    for (int g = 0; g < group; ++g) {
        float *row = scores + g * n, best = row[0], sum = 0.0f;
        for (int64_t j = 1; j < n; ++j) best = row[j] > best ? row[j] : best;
        v8 sums = {0};
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const v8 weights = exp8(load8(row + j) - best);
            store8(row + j, weights);
            sums += weights;
        }
        for (; j < n; ++j) {
            row[j] = expf(row[j] - best);
            sum += row[j];
        }
        total[g] = sum + hsum8(sums);
    }
    /* Weighted values, block by block. */
    memset(acc, 0, sizeof(float) * group * d);
    for (int64_t pos = first; pos < len; pos += count) {
        const float *v = block_run(vbase, table, pos, len, bs, d, &count);
        for (int g = 0; g < group; ++g)
            accumulate_run(acc + g * d, scores + g * n + (pos - first), v, count, d);
    }
    for (int g = 0; g < group; ++g) {
        const float inv = 1.0f / total[g];
        for (int i = 0; i < d; ++i) out[g * d + i] = acc[g * d + i] * inv;
    }
}

static void attend_64(const Problem *p, int64_t r, int kh, float *scores, float *acc) {
    attend_body(p, r, kh, scores, acc, 64);
}
static void attend_128(const Problem *p, int64_t r, int kh, float *scores, float *acc) {
    attend_body(p, r, kh, scores, acc, 128);
}
static void attend_any(const Problem *p, int64_t r, int kh, float *scores, float *acc) {
    attend_body(p, r, kh, scores, acc, p->head_dim);
}

static void *run_worker(void *arg) {
    Work *work = (Work *)arg;
    const Problem *p = work->p;
    const int group = p->heads / p->kv_heads;
    float *scores = malloc(sizeof(float) * (size_t)group * (size_t)work->longest);
    float *acc = malloc(sizeof(float) * (size_t)group * (size_t)p->head_dim);
    if (scores == NULL || acc == NULL) {
        __atomic_store_n(&work->failed, 1, __ATOMIC_RELAXED);
    } else {
        void (*attend)(const Problem *, int64_t, int, float *, float *) =
            p->head_dim == 64 ? attend_64 : p->head_dim == 128 ? attend_128 : attend_any;
        for (;;) {
            const int64_t item = __atomic_fetch_add(&work->next, 1, __ATOMIC_RELAXED);
            if (item >= work->items) break;
            attend(p, item / p->kv_heads, (int)(item % p->kv_heads), scores, acc);
        }
    }
    free(scores);
    free(acc);
    return NULL;
}

/* Returns 0 on success, a negative number on bad arguments or failed allocation. */
int tokenfair_paged_decode(
    const float *query, int64_t q_row_stride, int64_t q_head_stride,
    const float *keys, const float *values, int64_t kv_head_stride,
    const int64_t *tables, int64_t table_stride, const int64_t *lens, int64_t requests,
    float *out, int heads, int kv_heads, int head_dim, int block_size, int window,
    float scale, int threads) {
    if (requests < 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 ||
        block_size <= 0)
        return -1;
    if (requests == 0) return 0;
    const Problem problem = {query, keys, values, tables, lens, out, q_row_stride, q_head_stride,
                             kv_head_stride, table_stride, heads, kv_heads, head_dim, block_size,
                             window, scale};
    Work work = {&problem, requests * kv_heads, 1, 0, 0};
    for (int64_t r = 0; r < requests; ++r)
        if (lens[r] > work.longest) work.longest = lens[r];
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > work.items) threads = (int)work.items;

    pthread_t workers[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < threads; ++t)
        started[t] = pthread_create(&workers[t], NULL, run_worker, &work) == 0;
    run_worker(&work); /* the calling thread works too; it ends when no item is left */
    for (int t = 1; t < threads; ++t)
        if (started[t]) pthread_join(workers[t], NULL);
    return work.failed ? -2 : 0;
}
