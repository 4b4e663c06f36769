"""pipeline.train.ppo against hand numbers and independent loop-based float implementations."""
import inspect
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.train import ppo

ATOL = 1e-5


def rows_to_tensor(rows, width, left=False):
    """Pad python float rows to (B, width) plus the mask, right or left padded."""
    data, mask = [], []
    for row in rows:
        pad = [0.0] * (width - len(row))
        data.append(pad + list(row) if left else list(row) + pad)
        mask.append(([0.0] * len(pad) + [1.0] * len(row)) if left else ([1.0] * len(row) + [0.0] * len(pad)))
    return torch.tensor(data, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64)


def ref_mean(rows):
    flat = [x for r in rows for x in r]
    return sum(flat) / len(flat)


def ref_var(rows):
    flat = [x for r in rows for x in r]
    m = sum(flat) / len(flat)
    return sum((x - m) ** 2 for x in flat) / (len(flat) - 1)


def ref_whiten(rows, shift_mean=True):
    m, v = ref_mean(rows), ref_var(rows)
    return [[(x - m) / math.sqrt(v + 1e-8) + (0 if shift_mean else m) for x in r] for r in rows]


def ref_gae(values, rewards, gamma, lam):
    """Per-row loop over plain floats: advantages (unwhitened) and returns."""
    advs, rets = [], []
    for v, r in zip(values, rewards):
        adv, last = [0.0] * len(v), 0.0
        for t in reversed(range(len(v))):
            nxt = v[t + 1] if t + 1 < len(v) else 0.0
            last = r[t] + gamma * nxt - v[t] + gamma * lam * last
            adv[t] = last
        advs.append(adv)
        rets.append([a + x for a, x in zip(adv, v)])
    return advs, rets


def rand_rows(rng, lengths, scale=1.0):
    return [[rng.uniform(-scale, scale) for _ in range(n)] for n in lengths]


LENGTHS = [3, 5, 1, 4]  # B = 4 rows, T = 6 padded positions (B != T)
WIDTH = 6


def test_keyword_only_for_three_or_more_tensors():
    for name in ("kl_penalty", "total_rewards", "gae", "policy_loss", "value_loss", "scale_scores"):
        params = inspect.signature(getattr(ppo, name)).parameters.values()
        assert all(p.kind == p.KEYWORD_ONLY for p in params), name


def test_masked_mean_var_whiten_by_hand():
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert ppo.masked_mean(values, mask).item() == pytest.approx(2.0)
    assert ppo.masked_var(values, mask).item() == pytest.approx(1.0)  # ((1)^2+0+1)/2
    whitened = ppo.masked_whiten(values, mask)
    expected = torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]) / math.sqrt(1 + 1e-8)
    torch.testing.assert_close(whitened, expected, atol=ATOL, rtol=0)
    shifted = ppo.masked_whiten(values, mask, shift_mean=False)
    torch.testing.assert_close(shifted, (expected + 2.0) * mask, atol=ATOL, rtol=0)
    assert ppo.masked_mean(values, mask, axis=1).tolist() == pytest.approx([1.5, 3.0])


def test_masked_var_needs_two_positions():
    with pytest.raises(ValueError, match="at least 2"):
        ppo.masked_var(torch.ones(2, 3), torch.tensor([[1.0, 0, 0], [0, 0, 0]]))


def test_masked_position_contributes_nothing():
    rng = random.Random(0)
    values, mask = rows_to_tensor(rand_rows(rng, LENGTHS), WIDTH)
    noisy = torch.where(mask.bool(), values, torch.full_like(values, float("nan")))
    assert ppo.masked_mean(noisy, mask).item() == pytest.approx(ppo.masked_mean(values, mask).item())
    assert ppo.masked_var(noisy, mask).item() == pytest.approx(ppo.masked_var(values, mask).item())


def test_kl_penalty_kinds():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0], [-1.5, -0.1]])  # (B=3, T=2)
    ref = torch.tensor([[-1.5, -1.0], [-0.5, -2.0], [-1.0, -0.3]])
    diff = [[a - b for a, b in zip(r1, r2)] for r1, r2 in zip(lp.tolist(), ref.tolist())]
    kl = ppo.kl_penalty(logprobs=lp, ref_logprobs=ref, kind="kl")
    absolute = ppo.kl_penalty(logprobs=lp, ref_logprobs=ref, kind="abs")
    mse = ppo.kl_penalty(logprobs=lp, ref_logprobs=ref, kind="mse")
    torch.testing.assert_close(kl, torch.tensor(diff), atol=ATOL, rtol=0)
    torch.testing.assert_close(absolute, torch.tensor([[abs(d) for d in r] for r in diff]), atol=ATOL, rtol=0)
    torch.testing.assert_close(mse, torch.tensor([[0.5 * d * d for d in r] for r in diff]), atol=ATOL, rtol=0)


def test_kl_penalty_full_against_loop():
    gen = torch.Generator().manual_seed(0)
    logits, ref_logits = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, generator=gen)
    out = ppo.kl_penalty(logprobs=torch.zeros(2, 3), ref_logprobs=torch.zeros(2, 3), kind="full",
                         logits=logits, ref_logits=ref_logits)
    for b in range(2):
        for t in range(3):
            zp, zq = logits[b, t].tolist(), ref_logits[b, t].tolist()
            lse_p = math.log(sum(math.exp(z) for z in zp))
            lse_q = math.log(sum(math.exp(z) for z in zq))
            expected = sum(math.exp(a - lse_p) * ((a - lse_p) - (c - lse_q)) for a, c in zip(zp, zq))
            assert out[b, t].item() == pytest.approx(expected, abs=ATOL)
    with pytest.raises(ValueError, match="full"):
        ppo.kl_penalty(logprobs=torch.zeros(1, 1), ref_logprobs=torch.zeros(1, 1), kind="full")
    with pytest.raises(ValueError, match="Unknown"):
        ppo.kl_penalty(logprobs=torch.zeros(1, 1), ref_logprobs=torch.zeros(1, 1), kind="k2")


def test_total_rewards_by_hand():
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [1.0, 1.0, 1.0, 1.0]])  # (B=3, T=4)
    intrinsic = torch.tensor([[0.0, 1.0, 0.0, 9.0], [0.0, 0.0, -1.0, 0.5], [2.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    rewards, kl_rewards = ppo.total_rewards(env_rewards=torch.tensor([2.0, -1.0, 5.0]), kl=kl,
                                            intrinsic_rewards=intrinsic, mask=mask, kl_coef=0.5)
    expected = torch.tensor([
        [-0.05, 1.0 - 0.1, -0.15 + 2.0, 0.0],
        [0.0, -0.3, -1.0 - 0.35, -0.4 + 0.5 - 1.0],  # left padded row: score at the last token
        [-0.5 + 2.0 + 5.0, 0.0, 0.0, 0.0],
    ])
    torch.testing.assert_close(rewards, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(kl_rewards, -0.5 * kl * mask, atol=ATOL, rtol=0)


@pytest.mark.parametrize("whiten_rewards", [False, True])
def test_gae_against_loop(whiten_rewards):
    rng = random.Random(1)
    values_rows, reward_rows = rand_rows(rng, LENGTHS), rand_rows(rng, LENGTHS, 2.0)
    values, mask = rows_to_tensor(values_rows, WIDTH)
    rewards, _ = rows_to_tensor(reward_rows, WIDTH)
    values = values + (1 - mask) * 7.0  # garbage in padded positions must not matter
    advantages, returns = ppo.gae(values=values, rewards=rewards, mask=mask, gamma=0.9, lam=0.8,
                                  whiten_rewards=whiten_rewards)
    if whiten_rewards:
        reward_rows = ref_whiten(reward_rows, shift_mean=False)
    adv_rows, ret_rows = ref_gae(values_rows, reward_rows, 0.9, 0.8)
    expected_adv, _ = rows_to_tensor(ref_whiten(adv_rows), WIDTH)
    expected_ret, _ = rows_to_tensor(ret_rows, WIDTH)
    torch.testing.assert_close(advantages, expected_adv, atol=ATOL, rtol=0)
    torch.testing.assert_close(returns, expected_ret, atol=ATOL, rtol=0)
    assert not advantages.requires_grad


def test_gae_by_hand_single_row():
    # V = [1, 2], r = [0, 3], gamma = 1, lam = 1: A1 = 3 - 2 = 1, A0 = 0 + 2 - 1 + 1 = 2.
    advantages, returns = ppo.gae(values=torch.tensor([[1.0, 2.0]]), rewards=torch.tensor([[0.0, 3.0]]),
                                  mask=torch.ones(1, 2), gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[3.0, 3.0]]))
    # A = [2, 1]: mean 1.5, unbiased var 0.5, whitened = ±0.5 / sqrt(0.5).
    torch.testing.assert_close(advantages, torch.tensor([[0.5, -0.5]]) / math.sqrt(0.5 + 1e-8), atol=ATOL, rtol=0)


def ref_policy_loss(new, old, adv, cliprange):
    flat = [(n, o, a) for rn, ro, ra in zip(new, old, adv) for n, o, a in zip(rn, ro, ra)]
    losses, clipped, k3, k1, ratios = [], [], [], [], []
    for n, o, a in flat:
        r = math.exp(n - o)
        l1, l2 = -a * r, -a * min(max(r, 1 - cliprange), 1 + cliprange)
        losses.append(max(l1, l2))
        clipped.append(1.0 if l2 > l1 else 0.0)
        k3.append((r - 1) - (n - o))
        k1.append(o - n)
        ratios.append(r)
    avg = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return avg(losses), {"clipfrac": avg(clipped), "approx_kl": avg(k3), "policy_kl": avg(k1), "ratio_mean": avg(ratios)}


def test_policy_loss_against_loop():
    rng = random.Random(2)
    new_rows, old_rows = rand_rows(rng, LENGTHS, 0.5), rand_rows(rng, LENGTHS, 0.5)
    adv_rows = rand_rows(rng, LENGTHS, 1.0)
    new, mask = rows_to_tensor(new_rows, WIDTH)
    old, _ = rows_to_tensor(old_rows, WIDTH)
    adv, _ = rows_to_tensor(adv_rows, WIDTH)
    new.requires_grad_(True)
    loss, stats = ppo.policy_loss(logprobs=new, old_logprobs=old, advantages=adv, mask=mask, cliprange=0.2)
    expected_loss, expected_stats = ref_policy_loss(new_rows, old_rows, adv_rows, 0.2)
    assert loss.item() == pytest.approx(expected_loss, abs=ATOL)
    for key, value in expected_stats.items():
        assert stats[key] == pytest.approx(value, abs=ATOL), key
    assert expected_stats["clipfrac"] > 0  # the data exercises the clip
    loss.backward()
    assert new.grad[mask == 0].abs().max().item() == 0.0


def test_value_loss_against_loop():
    rng = random.Random(3)
    v_rows, old_rows, ret_rows = rand_rows(rng, LENGTHS), rand_rows(rng, LENGTHS), rand_rows(rng, LENGTHS)
    vpreds, mask = rows_to_tensor(v_rows, WIDTH)
    old, _ = rows_to_tensor(old_rows, WIDTH)
    ret, _ = rows_to_tensor(ret_rows, WIDTH)
    loss, clipfrac = ppo.value_loss(vpreds=vpreds, old_values=old, returns=ret, mask=mask, cliprange_value=0.2)
    terms, clipped = [], []
    for v, o, r in zip(sum(v_rows, []), sum(old_rows, []), sum(ret_rows, [])):
        vc = min(max(v, o - 0.2), o + 0.2)
        terms.append(max((v - r) ** 2, (vc - r) ** 2))
        clipped.append(1.0 if (vc - r) ** 2 > (v - r) ** 2 else 0.0)
    assert loss.item() == pytest.approx(0.5 * sum(terms) / len(terms), abs=ATOL)
    assert clipfrac == pytest.approx(sum(clipped) / len(clipped), abs=ATOL)


def test_entropy_from_logits_against_loop():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]], [[1.0, 2.0, 3.0, 4.0], [0, 0, 0, 0.0]],
                           [[-1.0, 0.5, 0.0, 2.0], [0.0, 1.0, 0.0, 1.0]]])  # (B=3, T=2, V=4)
    out = ppo.entropy_from_logits(logits)
    assert out.shape == (3, 2)
    for b in range(3):
        for t in range(2):
            z = logits[b, t].tolist()
            total = sum(math.exp(x) for x in z)
            expected = -sum((math.exp(x) / total) * math.log(math.exp(x) / total) for x in z)
            assert out[b, t].item() == pytest.approx(expected, abs=ATOL)
    assert out[0, 0].item() == pytest.approx(math.log(4), abs=ATOL)


def test_ratio_exceeds():
    assert ppo.ratio_exceeds(10.5, 10.0)
    assert not ppo.ratio_exceeds(10.0, 10.0)
    assert not ppo.ratio_exceeds(1.0, 10.0)


def test_adaptive_kl_controller_steps():
    ctl = ppo.AdaptiveKLController(0.2, target=6.0, horizon=10000.0)
    expected = 0.2
    for current in (12.0, 7.0, 1.0, 6.0):
        ctl.update(current, n_steps=256)
        e = min(max(current / 6.0 - 1, -0.2), 0.2)
        expected *= 1 + e * 256 / 10000
        assert ctl.value == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.2 * 1.00512 * (1 + (1 / 6) * 0.0256) * 0.99488 * 1.0)
    clone = ppo.AdaptiveKLController(1.0, 1.0, 1.0)
    clone.load_state_dict(ctl.state_dict())
    assert (clone.value, clone.target, clone.horizon) == (ctl.value, 6.0, 10000.0)


def test_fixed_kl_controller():
    ctl = ppo.FixedKLController(0.3)
    ctl.update(100.0, 64)
    assert ctl.value == 0.3
    other = ppo.FixedKLController(0.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.3


def test_running_moments_match_all_seen_scores():
    rng = random.Random(4)
    moments, seen = ppo.RunningMoments(), []
    for size in (5, 3, 8):
        batch = [rng.gauss(2.0, 3.0) for _ in range(size)]
        seen += batch
        mean, std = moments.update(torch.tensor(batch))
        assert mean == pytest.approx(sum(batch) / size, abs=ATOL)
        assert std == pytest.approx(math.sqrt(ref_var([batch])), abs=ATOL)
        assert moments.mean == pytest.approx(ref_mean([seen]), abs=ATOL)
        assert moments.std == pytest.approx(math.sqrt(ref_var([seen])), abs=ATOL)
    restored = ppo.RunningMoments()
    restored.load_state_dict(moments.state_dict())
    assert restored.state_dict() == moments.state_dict()


def test_scale_scores_scaling_norm_clip():
    raw = [1.0, 2.0, 6.0]
    std = math.sqrt(ref_var([raw]))
    eps = torch.finfo(torch.float32).eps
    scaled = ppo.scale_scores(scores=torch.tensor(raw), moments=ppo.RunningMoments(), use_score_scaling=True,
                              use_score_norm=False, score_clip=None)
    assert scaled.tolist() == pytest.approx([x / (std + eps) for x in raw], abs=ATOL)
    normed = ppo.scale_scores(scores=torch.tensor(raw), moments=ppo.RunningMoments(), use_score_scaling=True,
                              use_score_norm=True, score_clip=None)
    assert normed.tolist() == pytest.approx([(x - 3.0) / (std + eps) for x in raw], abs=ATOL)
    clipped = ppo.scale_scores(scores=torch.tensor(raw), moments=ppo.RunningMoments(), use_score_scaling=False,
                               use_score_norm=True, score_clip=1.5)
    assert clipped.tolist() == pytest.approx([1.0, 1.5, 1.5])
    untouched = ppo.RunningMoments()
    ppo.scale_scores(scores=torch.tensor(raw), moments=untouched, use_score_scaling=False, use_score_norm=False,
                     score_clip=None)
    assert untouched.count == 1e-24


# --- padding invariance (hypothesis) -------------------------------------------------------

row_lengths = st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=5)


@settings(max_examples=40, deadline=None)
@given(lengths=row_lengths, extra=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_padding_layout_never_changes_results(lengths, extra, seed):
    rng = random.Random(seed)
    rows = {k: rand_rows(rng, lengths) for k in ("values", "rewards", "new", "old", "vpreds")}
    width = max(lengths)
    results = []
    for w, left in ((width, False), (width, True), (width + extra, False), (width + extra, True)):
        t = {k: rows_to_tensor(v, w, left)[0] for k, v in rows.items()}
        mask = rows_to_tensor(rows["values"], w, left)[1]
        adv, ret = ppo.gae(values=t["values"], rewards=t["rewards"], mask=mask, gamma=0.95, lam=0.9)
        pg, pstats = ppo.policy_loss(logprobs=t["new"], old_logprobs=t["old"], advantages=adv, mask=mask,
                                     cliprange=0.2)
        vf, vclip = ppo.value_loss(vpreds=t["vpreds"], old_values=t["values"], returns=ret, mask=mask,
                                   cliprange_value=0.2)
        per_row = [adv[b][mask[b].bool()].tolist() for b in range(len(lengths))]
        per_row_ret = [ret[b][mask[b].bool()].tolist() for b in range(len(lengths))]
        results.append((pg.item(), vf.item(), vclip, pstats, per_row, per_row_ret))
    base = results[0]
    for other in results[1:]:
        assert other[0] == pytest.approx(base[0], abs=ATOL)
        assert other[1] == pytest.approx(base[1], abs=ATOL)
        assert other[2] == pytest.approx(base[2], abs=ATOL)
        for key in base[3]:
            assert other[3][key] == pytest.approx(base[3][key], abs=ATOL)
        for a, b in zip(other[4] + other[5], base[4] + base[5]):
            assert a == pytest.approx(b, abs=ATOL)
