"""Top-k/top-p kept sets equal to vLLM's filter, without vLLM's full index sort wherever the result cannot differ.

vLLM's filter (``apply_top_k_top_p``) and ``npu_top_k_top_p`` define the kept
set through one ascending sort of the row: the top-k keeps every token not
below the k-th largest value (ties kept); the top-p drops each sorted position
whose running probability mass (softmax over the top-k survivors, cumsum from
the smallest token up) is at most ``1 - p``; the largest position always
survives. The reference provider of the ops seam computes exactly that
(``ReferenceOps.top_k_top_p``). The float sums depend only on the sorted
*values*, so any sort of the values gives the same masses, bit for bit; the
order of *equal* values (``torch.sort`` is unstable on CPU) matters only when
a run of equal values straddles the top-p boundary, where it decides which of
them survive. Here:

* rows with a top-k: the k best tokens (plus every token tied with the k-th)
  come from ``torch.topk``; the nucleus inside them is computed on a short
  buffer laid out so that torch's softmax and cumsum see the kept values at
  the same positions modulo 256 as in vLLM's sorted row, which makes the
  float results bitwise those of the full-row computation;
* rows with a top-p alone: the values are sorted with NumPy (SIMD sort,
  values only, some 25x faster than ``torch.sort`` with indices on a
  151,936-token row), the masses computed by the same torch softmax and
  cumsum, and the kept set is every token at or above the first kept value;
* a row whose top-p boundary splits a run of equal values takes the order
  of that run from ``torch.sort`` of the row, as vLLM does, and drops the
  run's tokens before the (already known) boundary. When most recent rows
  were like that (tie-heavy logits, e.g. a bf16 model's), top-p rows are
  sorted by ``torch.sort`` directly (:class:`SortStats`).

The result is a :class:`KeptSets`: short candidate lists for top-k rows and
whole (masked) rows for the rest, which the fast sampler samples with the same
per-token noise as vLLM-CPU's fused Gumbel-max kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ascend_kernel.upstream import vllm_c_ops

NEG_INF = float("-inf")
#: positions of the short nucleus buffer agree with vLLM's sorted row modulo this (any SIMD lane/accumulator layout up to 256 floats)
LANE_PERIOD = 256
#: dtypes handled here (NumPy sorts them; torch's softmax/cumsum are the ones vLLM uses); others go to the reference
FAST_DTYPES = (torch.float32, torch.float64)


def _reference_filter(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    from ascend_kernel.ops import get_ops

    return get_ops("reference", "cpu").top_k_top_p(logits, k, p)


@dataclass
class KeptSets:
    """The kept set of each row of a ``[batch, vocab]`` logits tensor.

    ``cand_rows[i]`` keeps the tokens ``cand_idx[i]`` whose ``cand_val[i]``
    is finite (values are the logits; -inf marks a non-kept or padding slot;
    padding repeats a kept token). ``full_rows[j]`` keeps the finite entries
    of ``full_logits[j]`` (a whole row, masked where the filter dropped
    tokens, or the raw row where nothing is filtered).
    """

    batch: int
    vocab: int
    cand_rows: torch.Tensor
    cand_idx: torch.Tensor
    cand_val: torch.Tensor
    full_rows: torch.Tensor
    full_logits: torch.Tensor

    def materialize(self, like: torch.Tensor) -> torch.Tensor:
        """The filtered logits: kept tokens keep their logit, the rest are -inf."""
        out = torch.full_like(like, NEG_INF)
        if self.cand_rows.numel():
            block = out[self.cand_rows]
            block.scatter_(1, self.cand_idx, self.cand_val.to(out.dtype))
            out[self.cand_rows] = block
        if self.full_rows.numel():
            out[self.full_rows] = self.full_logits.to(out.dtype)
        return out

    def sample(self, seeds: torch.Tensor) -> torch.Tensor:
        """One token per row, drawn exactly as vLLM-CPU's ``fused_gumbel_argmax`` draws it over the filtered row."""
        out = torch.zeros(self.batch, dtype=torch.long, device=seeds.device)
        if self.cand_rows.numel():
            out[self.cand_rows] = gumbel_argmax_candidates(self.cand_idx, self.cand_val, seeds[self.cand_rows],
                                                           self.vocab)
        if self.full_rows.numel():
            rows = self.full_logits.to(torch.float32).contiguous()
            out[self.full_rows] = vllm_c_ops(load=False).fused_gumbel_argmax(rows, seeds[self.full_rows].contiguous())
        return out


# -- the per-token noise of vLLM-CPU's fused Gumbel-max ------------------------------------------------------


def _as_int64(value: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _as_int64(0x9E3779B97F4A7C15)
_MIX1 = _as_int64(0xBF58476D1CE4E5B9)
_MIX2 = _as_int64(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, n: int) -> torch.Tensor:
    # logical shift of the uint64 bits held in an int64 tensor
    return (x >> n) & ((1 << (64 - n)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def gumbel_noise(seeds: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Float64 Gumbel(0, 1) noise of token ``token_ids[r, j]`` for a row drawn with ``seeds[r]``.

    The same stream vLLM-CPU's fused kernel uses: a SplitMix64 key per seed,
    53 random bits per (key, token), ``u = (bits + 0.5) / 2^53``,
    ``g = -log(-log u)`` (checked bit for bit against the kernel in the tests).
    """
    key = _splitmix64(seeds.to(torch.int64)).unsqueeze(1)
    bits = _shift_right(_splitmix64(key + (token_ids.to(torch.int64) + 1) * _GOLDEN), 11)
    u = (bits.to(torch.float64) + 0.5) * 2.0**-53
    return _neg(_log(_neg(_log(u))))


def _neg(x: torch.Tensor) -> torch.Tensor:
    return x.neg_()


# On CPU through NumPy: torch hands even a few thousand exps/logs to MKL's threaded VML, which on a busy host
# waits milliseconds for a worker thread; candidate lists are small enough for one thread.
def _exp(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return torch.from_numpy(np.exp(x.numpy()))
    return torch.exp(x)


def _log(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return torch.from_numpy(np.log(x.numpy()))
    return torch.log(x)


def gumbel_argmax_candidates(token_ids: torch.Tensor, values: torch.Tensor, seeds: torch.Tensor,
                             vocab: int) -> torch.Tensor:
    """argmax over each row's finite candidates of ``logit + noise``; equal scores go to the lowest token id
    (the fused kernel's order); a row without a finite candidate gives 0, as the kernel does."""
    score = values.to(torch.float64) + gumbel_noise(seeds, token_ids)
    score = score.masked_fill(~torch.isfinite(values), NEG_INF)
    best = score.amax(dim=-1, keepdim=True)
    winner = token_ids.masked_fill(score != best, vocab).amin(dim=-1)
    return torch.where(torch.isfinite(best.squeeze(1)), winner, torch.zeros_like(winner))


# -- kept sets ----------------------------------------------------------------------------------------------------


class SortStats:
    """How often recent top-p rows had their boundary inside a run of equal values (a running average)."""

    __slots__ = ("split_share",)

    def __init__(self) -> None:
        self.split_share = 0.0

    def record(self, split: int, rows: int) -> None:
        if rows:
            self.split_share += 0.25 * (split / rows - self.split_share)

    def expect_split(self) -> bool:
        return self.split_share > 0.5


def kept_sets(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, *,
              exact_unfiltered: bool = False, stats: SortStats | None = None) -> KeptSets:
    """The rows' kept sets under vLLM's top-k/top-p filter (see the module docstring).

    ``k`` and ``p`` are per-row tensors or None; ``k <= 0`` or ``k >= vocab``
    means no top-k for that row. With ``exact_unfiltered`` a row that only has
    ``p == 1`` gets vLLM's mask (its filter then still drops the tokens whose
    float probability is 0; they can never be drawn, so sampling does not
    need it). ``stats``, kept by the caller across calls, lets top-p rows of
    tie-heavy logits go straight to the index sort (see :func:`_top_p_rows`).
    """
    batch, vocab = logits.shape
    device = logits.device
    empty_rows = torch.empty(0, dtype=torch.long, device=device)
    if logits.dtype not in FAST_DTYPES or device.type != "cpu":
        masked = _reference_filter(logits, k, p)
        return KeptSets(batch, vocab, empty_rows, empty_rows.view(0, 1), logits.new_empty(0, 1),
                        torch.arange(batch, device=device), masked)

    kk = k.to(torch.long) if k is not None else None
    has_k = ((kk > 0) & (kk < vocab)) if kk is not None else torch.zeros(batch, dtype=torch.bool, device=device)
    thr = (1 - p) if p is not None else None  # vLLM's threshold, in p's dtype
    if thr is None:
        nucleus = torch.zeros_like(has_k)
    else:  # a row with p == 1 drops only zero-probability tokens: done when the mask is wanted
        nucleus = ~has_k & ((thr > 0) | ((thr == 0) & exact_unfiltered))
    unfiltered = ~has_k & ~nucleus

    cands: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    full_parts: list[tuple[torch.Tensor, torch.Tensor]] = []

    rows = has_k.nonzero().squeeze(1)
    if rows.numel():
        x = _take(logits, rows)
        ok, idx, val, split = _top_k_rows(x, kk[rows], thr[rows] if thr is not None else None)
        if bool(ok.all()):
            cands.append((rows, idx, val))
        else:
            cands.append((rows[ok], idx[ok], val[ok]))
            tied = (~ok).nonzero().squeeze(1)
            value, start, stop = (part[tied] for part in split)
            xt = _take(x, tied)
            out = xt.masked_fill(xt < value.unsqueeze(1), NEG_INF)  # the run and everything above it
            all_rows = torch.arange(tied.numel(), device=device)
            full_parts.append((rows[tied], _drop_in_sort_order(out, xt, all_rows, start, stop)))
    rows = nucleus.nonzero().squeeze(1)
    if rows.numel():
        full_parts.append((rows, _top_p_rows(_take(logits, rows), thr[rows], stats)))
    rows = unfiltered.nonzero().squeeze(1)
    if rows.numel():
        full_parts.append((rows, _take(logits, rows)))

    cand_rows, cand_idx, cand_val = _stack_candidates(cands, logits, empty_rows)
    if len(full_parts) == 1:
        full_rows, full_logits = full_parts[0]
    elif full_parts:
        full_rows = torch.cat([r for r, _ in full_parts])
        full_logits = torch.cat([x for _, x in full_parts])
    else:
        full_rows, full_logits = empty_rows, logits.new_empty(0, vocab)
    return KeptSets(batch, vocab, cand_rows, cand_idx, cand_val, full_rows, full_logits)


def filter_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM's filter, computed through :func:`kept_sets` (a new tensor; ``logits`` is not changed)."""
    if k is None and p is None:
        return logits.clone()
    return kept_sets(logits, k, p, exact_unfiltered=True).materialize(logits)


def _drop_in_sort_order(out: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, start: torch.Tensor,
                        stop: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
    """Rows whose top-p boundary splits a run of equal values: ``out`` keeps the whole run; drop the run's
    tokens at positions ``start .. stop - 1`` of ``torch.sort``'s order of the row, the order vLLM's filter
    sees (the same call on the same values), so the same tied tokens survive. Changes ``out[rows]`` in place;
    ``order``, when given, is that order for ``rows``."""
    if order is None:
        order = _take(x, rows).sort(dim=-1).indices
    for i, (r, a, b) in enumerate(zip(rows.tolist(), start.tolist(), stop.tolist())):
        out[r, order[i, a:b]] = NEG_INF
    return out


def _top_p_rows(x: torch.Tensor, thr: torch.Tensor, stats: SortStats | None = None) -> torch.Tensor:
    """Rows with a top-p alone (``1 - p >= 0``), masked as vLLM's filter masks them.

    The values are sorted by NumPy, unless ``stats`` says most recent rows had their boundary inside a run
    of equal values (tie-heavy logits, e.g. a bf16 model's): those need torch's index sort anyway, so then
    it is done first, once, as vLLM does.
    """
    order = None
    if stats is not None and stats.expect_split():
        ordered, order = x.sort(dim=-1)
    else:
        ordered = torch.from_numpy(np.sort(x.contiguous().numpy(), axis=-1))  # ascending values, no indices
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)  # vLLM's arithmetic on the same values
    drop = mass <= thr.unsqueeze(1)
    drop[:, -1] = False
    dropped = drop.sum(dim=-1, keepdim=True)  # a prefix: the mass never decreases
    first_kept = ordered.gather(1, dropped)
    last_dropped = ordered.gather(1, (dropped - 1).clamp(min=0))
    out = x.masked_fill(x < first_kept, NEG_INF)
    split = ((dropped > 0) & (last_dropped == first_kept)).squeeze(1)
    if stats is not None:
        stats.record(int(split.sum()), split.numel())
    if bool(split.any()):
        rows = split.nonzero().squeeze(1)
        start = torch.searchsorted(_take(ordered, rows), first_kept[rows])  # where the run of equal values starts
        _drop_in_sort_order(out, x, rows, start.squeeze(1), dropped[rows].squeeze(1),
                            _take(order, rows) if order is not None else None)
    return out


def _take(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` for ascending row indices, without a copy when they are all the rows."""
    return x if rows.numel() == x.shape[0] else x[rows]


def _stack_candidates(parts, logits, empty_rows):
    parts = [part for part in parts if part[0].numel()]
    if not parts:
        return empty_rows, empty_rows.view(0, 1), logits.new_empty(0, 1)
    if len(parts) == 1:
        return parts[0]
    width = max(idx.shape[1] for _, idx, _ in parts)
    rows, idxs, vals = [], [], []
    for r, idx, val in parts:
        if idx.shape[1] < width:  # pad with the row's best token (always kept): scatter writes it twice, same value
            pad = width - idx.shape[1]
            idx = torch.cat([idx, idx[:, :1].expand(-1, pad)], dim=1)
            val = torch.cat([val, val[:, :1].expand(-1, pad)], dim=1)
        rows.append(r)
        idxs.append(idx)
        vals.append(val)
    return torch.cat(rows), torch.cat(idxs), torch.cat(vals)


def _top_k_rows(x: torch.Tensor, k: torch.Tensor, thr: torch.Tensor | None):
    """Rows with a top-k (``0 < k < vocab``): (rows served, token ids, kept values or -inf, window-wide, and
    for the rows not served, whose top-p boundary splits a run of equal values: the run's value, the position
    where it starts in vLLM's sorted row and the number of positions the top-p drops)."""
    vocab = x.shape[1]
    kmax = int(k.max())
    width = min(vocab, kmax + max(16, kmax // 4))
    vals, idx = x.topk(width, dim=-1)
    kth = vals.gather(1, (k - 1).unsqueeze(1))
    if width < vocab:
        # every token tied with the k-th value is kept: widen the window when a tie may run past it
        short = (vals[:, -1:] >= kth).squeeze(1) & (kth.squeeze(1) > NEG_INF)
        if bool(short.any()):
            width = min(vocab, max(width, int((x[short] >= kth[short]).sum(dim=-1).max())))
            vals, idx = x.topk(width, dim=-1)
    cand = vals >= kth  # a prefix of the descending window
    if thr is None:
        ok = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        return ok, idx, vals.masked_fill(~cand, NEG_INF), None

    # The nucleus inside the top-k, on a buffer that ends like vLLM's sorted row: ascending, candidates last,
    # -inf before them, length congruent to the vocabulary modulo LANE_PERIOD.
    asc = vals.flip(-1).masked_fill(~cand.flip(-1), NEG_INF)
    length = width + (vocab - width) % LANE_PERIOD
    buf = asc if length == width else torch.cat([asc.new_full((asc.shape[0], length - width), NEG_INF), asc], dim=1)
    mass = buf.softmax(dim=-1).cumsum(dim=-1)
    drop = mass <= thr.unsqueeze(1)
    drop[:, -1] = False
    dropped = drop.sum(dim=-1, keepdim=True)  # drop is a prefix: mass never decreases
    last_dropped = buf.gather(1, (dropped - 1).clamp(min=0))
    first_kept = buf.gather(1, dropped.clamp(max=length - 1))
    # a run of equal values across the boundary: which of them vLLM keeps depends on its sort order
    ok = ~((dropped > 0) & (last_dropped == first_kept)).squeeze(1)
    keep = (~drop & torch.isfinite(buf))[:, length - width:].flip(-1)
    # for a split run: its value, and in vLLM's sorted row (whose last `length` positions are the buffer's)
    # where the run starts and where the dropped part ends; every token at or above the run is in the window
    run_start = vocab - (vals >= first_kept).sum(dim=-1)
    return ok, idx, vals.masked_fill(~keep, NEG_INF), (first_kept.squeeze(1), run_start,
                                                        (vocab - length + dropped).squeeze(1))
