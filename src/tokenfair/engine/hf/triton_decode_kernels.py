"""The Triton kernels of triton_decode.py (imported only where Triton is installed).

Kept as plain functions, compiled by `triton.jit` for a GPU or run by Triton's
interpreter on the CPU (triton_decode._kernels): the interpreter rewrites a kernel
through its module's `tl`, so the kernels live at a module's top level.
"""

import triton.language as tl


def partials(
    query,
    keys,
    values,
    tables,
    lens,
    part_max,
    part_sum,
    part_acc,
    q_row,
    q_head,
    kv_head_stride,
    table_row,
    scale,
    window,
    partitions,
    heads,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    PART: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # A tile of TILE positions (several blocks) per iteration: more loads in flight.
    r = tl.program_id(0)
    kh = tl.program_id(1)
    p = tl.program_id(2)
    length = tl.load(lens + r)
    first = tl.maximum(length - window, 0)  # `window`: the whole context when unset
    begin = tl.maximum(p * PART, first)
    end = tl.minimum(p * PART + PART, length)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    t = tl.arange(0, TILE)
    head = kh * GROUP + g
    head_ok = g < GROUP
    dim_ok = d < D
    q = tl.load(
        query + r * q_row + head[:, None] * q_head + d[None, :],
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    kv_base = kh.to(tl.int64) * kv_head_stride
    for start in range(begin - begin % TILE, end, TILE):
        pos = start + t
        valid = (pos >= begin) & (pos < end)
        block = tl.load(tables + r * table_row + pos // BLOCK, mask=valid, other=0)
        rows = (block * BLOCK + pos % BLOCK).to(tl.int64)
        where = kv_base + rows[:, None] * D + d[None, :]
        mask = valid[:, None] & dim_ok[None, :]
        k = tl.load(keys + where, mask=mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        scores = tl.where(valid[None, :], scores * scale, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)
        fade = tl.exp(best - shift)
        weights = tl.exp(scores - shift[:, None])
        total = total * fade + tl.sum(weights, axis=1)
        v = tl.load(values + where, mask=mask, other=0.0)
        acc = acc * fade[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
        best = new_best
    at = (r * heads + head) * partitions + p
    tl.store(part_max + at, best, mask=head_ok)
    tl.store(part_sum + at, total, mask=head_ok)
    tl.store(part_acc + at[:, None] * D + d[None, :], acc, mask=head_ok[:, None] & dim_ok[None, :])


def reduce(
    part_max,
    part_sum,
    part_acc,
    out,
    out_row,
    out_head,
    partitions,
    heads,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    P_PAD: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.arange(0, P_PAD)
    d = tl.arange(0, D_PAD)
    used = p < partitions
    at = (r * heads + h) * partitions + p
    best = tl.load(part_max + at, mask=used, other=float("-inf"))
    total = tl.load(part_sum + at, mask=used, other=0.0)
    top = tl.max(best, axis=0)
    shift = tl.where(top == float("-inf"), 0.0, top)
    scale = tl.exp(best - shift)
    denominator = tl.sum(scale * total, axis=0)
    acc = tl.load(
        part_acc + at[:, None] * D + d[None, :],
        mask=used[:, None] & (d[None, :] < D),
        other=0.0,
    )
    summed = tl.sum(scale[:, None] * acc, axis=0)
    # No key to attend to (an empty window): zeros, as an empty weighted sum.
    result = summed / tl.where(denominator == 0.0, 1.0, denominator)
    tl.store(out + r * out_row + h * out_head + d, result.to(out.dtype.element_ty), mask=d < D)
