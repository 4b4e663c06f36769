"""pipeline.train.ppo at the edges of its mask convention (issue 37, item 5).

- the env reward lands on the last response token whatever the mask's dtype (bf16 rounds positions above 256);
- a row with no response tokens is an error naming the row, not a silently dropped env reward;
- a mask that is not 0/1 is an error naming the bad values (masked_mean would be a weighted mean otherwise),
  while bool, integer and float 0/1 masks give the same numbers.
"""
import pytest
import torch

from pipeline.train import ppo


def right_padded_mask(lengths, width, dtype):
    """(B, width) mask with `lengths[b]` leading ones per row."""
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(dtype)  # (B, T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.bool, torch.long])
def test_env_reward_on_last_token_for_any_mask_dtype(dtype):
    # bf16 holds every integer only up to 256: position 279 rounded to 280 put row 0's reward on the wrong token
    lengths, width = [279, 300, 3], 300
    mask = right_padded_mask(lengths, width, dtype)  # (B=3, T=300)
    zeros = torch.zeros(3, width)
    rewards, _ = ppo.total_rewards(env_rewards=torch.tensor([1.0, 2.0, 3.0]), kl=zeros, intrinsic_rewards=zeros,
                                   mask=mask, kl_coef=0.1)
    for b, n in enumerate(lengths):
        assert rewards[b].nonzero().flatten().tolist() == [n - 1], (dtype, b)
        assert rewards[b, n - 1].item() == float(b + 1)


def test_row_without_response_tokens_is_an_error_naming_it():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    zeros = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"row\(s\) \[1, 3\] have no response token"):
        ppo.total_rewards(env_rewards=torch.ones(4), kl=zeros, intrinsic_rewards=zeros, mask=mask, kl_coef=0.1)


def test_mask_that_is_not_zero_one_is_an_error_naming_the_values():
    values = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    weighted = torch.tensor([[1.0, 0.5], [1.0, 0.0]])
    with pytest.raises(ValueError, match=r"0\.5"):
        ppo.masked_mean(values, weighted)
    with pytest.raises(ValueError, match=r"2\.0"):
        ppo.masked_whiten(values, torch.tensor([[2.0, 1.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"nan"):
        ppo.masked_mean(values, torch.tensor([[1.0, float("nan")], [1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"0\.5"):
        ppo.gae(values=values, rewards=values, mask=weighted, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match=r"0\.5"):
        ppo.policy_loss(logprobs=values, old_logprobs=values, advantages=values, mask=weighted, cliprange=0.2)
    with pytest.raises(ValueError, match=r"0\.5"):
        ppo.value_loss(vpreds=values, old_values=values, returns=values, mask=weighted, cliprange_value=0.2)
    with pytest.raises(ValueError, match=r"0\.5"):
        ppo.total_rewards(env_rewards=torch.ones(2), kl=values, intrinsic_rewards=values, mask=weighted,
                          kl_coef=0.1)
    with pytest.raises(ValueError, match=r"0\.5"):
        ppo.token_kl_rewards("ppo", kl=values, old_logprobs=values, ref_logprobs=values, mask=weighted, kl_coef=0.1)


def test_bool_int_and_float_masks_give_the_same_numbers():
    gen = torch.Generator().manual_seed(0)
    values, rewards = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)  # (B, T)
    base = right_padded_mask([5, 2, 4], 5, torch.float32)
    expected = ppo.gae(values=values, rewards=rewards, mask=base, gamma=0.9, lam=0.8, whiten_rewards=True)
    for dtype in (torch.bool, torch.long, torch.float64):
        mask = base.to(dtype)
        assert ppo.masked_mean(values, mask).item() == pytest.approx(ppo.masked_mean(values, base).item())
        got = ppo.gae(values=values, rewards=rewards, mask=mask, gamma=0.9, lam=0.8, whiten_rewards=True)
        for ours, theirs in zip(got, expected):
            torch.testing.assert_close(ours.float(), theirs, atol=1e-6, rtol=0)
