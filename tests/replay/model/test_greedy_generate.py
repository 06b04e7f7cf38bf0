"""``greedy_generate`` (``record train --max-new-tokens``, the demo's data build) is transformers'
``model.generate`` and gives, token for token, the plain greedy loop it replaced: argmax of the last
logits with a KV cache, never stopping at EOS, whatever the target's own generation defaults say.
Run on the committed tiny target (traces/models) in bfloat16, as ``record train`` loads it.
"""

from __future__ import annotations

import pytest
import torch

from specdiff.replay.model.target_capture import greedy_generate, load_target

NEW = 24


def _argmax_loop(model, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """The greedy loop greedy_generate replaced: prefill, then one token per step on the cache."""
    from transformers import DynamicCache

    out = model(input_ids=prompts, past_key_values=DynamicCache(), use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    gen = [nxt]
    for _ in range(max_new_tokens - 1):
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        gen.append(nxt)
    return torch.cat(gen, dim=1)


@pytest.fixture(scope="module")
def target(repo_models):
    return load_target(repo_models / "target")


@pytest.fixture(scope="module")
def prompts(repo_models) -> list[list[int]]:
    from specdiff.demo.run import demo_prompts

    return demo_prompts(repo_models, 3)


@torch.no_grad()
def test_greedy_generate_gives_the_tokens_of_the_plain_argmax_loop(target, prompts):
    for p in prompts:
        x = torch.tensor([p])
        got = greedy_generate(target, x, NEW)
        assert got.shape == (1, NEW) and got.dtype == torch.int64
        assert torch.equal(got, _argmax_loop(target, x, NEW))


@torch.no_grad()
def test_a_batch_with_pad_ids_in_its_prompts_attends_every_prompt_token(target):
    # the target's pad id (2) inside equal-length prompts: generate must not mask it out
    pad = target.generation_config.pad_token_id
    assert pad is not None
    x = torch.randint(3, target.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    x[:, 5] = pad
    assert torch.equal(greedy_generate(target, x, NEW), _argmax_loop(target, x, NEW))


@torch.no_grad()
def test_eos_and_the_targets_generation_defaults_change_nothing(target, prompts):
    x = torch.tensor([prompts[0]])
    plain = _argmax_loop(target, x, NEW)
    own = target.generation_config
    cfg = own.__class__.from_dict(own.to_dict())
    cfg.eos_token_id = int(plain[0, 2])  # the third greedy token is EOS: generation must go on
    cfg.repetition_penalty = 5.0  # the target's defaults would penalize, force EOS, suppress
    cfg.forced_eos_token_id = int(plain[0, 0])
    cfg.suppress_tokens = [int(plain[0, 1])]
    target.generation_config = cfg
    try:
        got = greedy_generate(target, x, NEW)
        assert target.generation_config is cfg  # given back as it was
    finally:
        target.generation_config = own
    assert torch.equal(got, plain)
