"""The benchmarks' one FLOP convention for attention: the Python twin of bench/flops.h (the two
must say the same; that file says why). 4 d FLOPs per visible (query, key) score and head forward,
2.5x that backward, 3.5x forward + backward; causal counts the visible scores, bottom-right aligned
as the library's mask (N(N+1)/2 for seqlen_q = seqlen_k = N)."""

PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def visible_scores(seqlen_q, seqlen_k, causal):
    """Visible (query, key) scores of one head."""
    if not causal:
        return float(seqlen_q) * seqlen_k
    if seqlen_k >= seqlen_q:
        return float(seqlen_q) * (seqlen_k - seqlen_q) + seqlen_q * (seqlen_q + 1.0) / 2.0
    return seqlen_k * (seqlen_k + 1.0) / 2.0


def attention_flops(batch_heads, seqlen_q, seqlen_k, head_dim, causal, which="fwd"):
    """FLOPs of one pass ("fwd", "bwd" or "fwdbwd") over batch_heads (batch x heads_q) pairs."""
    return 4.0 * visible_scores(seqlen_q, seqlen_k, causal) * head_dim * batch_heads * PASS_FACTOR[which]
