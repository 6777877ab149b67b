"""train_gpt2.Muon against torch.optim.Muon, whose update it batches: the same steps, a state
that resumes bit-exactly (and torch's that resumes with ours), on any GPT that GPTConfig builds."""

import copy

import pytest
import torch

from train_gpt2 import GPT, GPTConfig, Muon

CONFIGS = {
    "3 layers": GPTConfig(block_size=8, vocab_size=32, n_layer=3, n_head=2, n_embd=32),
    "1 head, 8 wide": GPTConfig(block_size=8, vocab_size=50, n_layer=1, n_head=1, n_embd=8),
    "3 heads, 24 wide": GPTConfig(block_size=4, vocab_size=17, n_layer=2, n_head=3, n_embd=24),
}


def gpt_and_muon(config):
    # a GPT and the Muon configure_optimizers gives it (its blocks' matrices)
    torch.manual_seed(0)
    model = GPT(config)
    muon = model.configure_optimizers(0.1, 1e-3, "cpu", muon_lr=0.02)[-1]
    assert isinstance(muon, Muon)
    return model, muon


def torch_muon(params, like):
    # torch.optim.Muon over params with the hyper-parameters of our Muon `like`
    group = like.param_groups[0]
    groups = [{"params": params, "lr_scale": group["lr_scale"]}]
    return torch.optim.Muon(groups, lr=group["lr"], weight_decay=group["weight_decay"])


def take_step(opt, step):
    # one step at this step's gradients (random, seeded by the step) and lr (falling, as the
    # schedule's does), set as the training loop sets it
    generator = torch.Generator().manual_seed(step)
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.randn(p.shape, generator=generator)
    for group in opt.param_groups:
        group["lr"] = 1e-3 * (1 - step / 20) * group.get("lr_scale", 1.0)
    opt.step()


def assert_close_to(ours, theirs, before):
    # ours within 5% of theirs, measured against how far theirs moved from before: bfloat16's
    # rounding passes (another order of the same products moves a step ~2%), a wrong coefficient
    # (17%), step count, lr scale, decay or momentum does not
    for p, q, b in zip(ours, theirs, before):
        moved = (q - b).norm()
        assert moved > 0
        assert (p.detach() - q).norm() < 5e-2 * moved, tuple(p.shape)


def test_ours_steps_as_torch_muon_does():
    # The blocks' matrices of a 3-layer GPT: square (attn.c_proj), tall (c_attn, c_fc) and wide
    # (mlp.c_proj), 3 of each shape, so each shape's stack is exercised. A heavy weight decay,
    # so that its term weighs in the comparison.
    model, muon = gpt_and_muon(CONFIGS["3 layers"])
    ours = muon.param_groups[0]["params"]
    shapes = [tuple(p.shape) for p in ours]
    assert {(r > c) - (r < c) for r, c in shapes} == {-1, 0, 1}, "square, wide and tall"
    assert len(set(shapes)) < len(shapes), "several matrices of a shape"
    theirs = [p.detach().clone() for p in ours]
    muon.param_groups[0]["weight_decay"] = 10.0
    reference = torch_muon(theirs, like=muon)
    for step in range(6):
        before = [q.clone() for q in theirs]
        take_step(muon, step)
        take_step(reference, step)
        assert_close_to(ours, theirs, before)
    for p, q in zip(ours, theirs):
        ours_buffer = muon.state[p]["momentum_buffer"]
        torch.testing.assert_close(ours_buffer, reference.state[q]["momentum_buffer"])


def test_its_state_resumes_bit_exactly(tmp_path):
    # 3 steps, a checkpoint (saved, then loaded as the training loop loads it), 3 more steps:
    # the weights and momentum buffers of 6 steps straight
    config = CONFIGS["3 layers"]
    straight, muon = gpt_and_muon(config)
    for step in range(3):
        take_step(muon, step)
    torch.save({"model": straight.state_dict(), "muon": muon.state_dict()}, tmp_path / "ckpt.pt")
    for step in range(3, 6):
        take_step(muon, step)
    saved = torch.load(tmp_path / "ckpt.pt")
    assert all(state.keys() == {"momentum_buffer"} for state in saved["muon"]["state"].values())
    resumed = GPT(config)
    resumed.load_state_dict(saved["model"])
    again = resumed.configure_optimizers(0.1, 1e-3, "cpu", muon_lr=0.02)[-1]
    params = again.state_dict()["param_groups"]
    again.load_state_dict({"state": saved["muon"]["state"], "param_groups": params})
    for step in range(3, 6):
        take_step(again, step)
    for p, q in zip(muon.param_groups[0]["params"], again.param_groups[0]["params"]):
        assert torch.equal(p, q)
        assert torch.equal(muon.state[p]["momentum_buffer"], again.state[q]["momentum_buffer"])


def test_a_checkpoint_of_torch_muon_resumes_with_ours():
    # checkpoints written before train_gpt2 had its own Muon hold torch's state: the same form
    model, muon = gpt_and_muon(CONFIGS["3 layers"])
    theirs = [p.detach().clone() for p in muon.param_groups[0]["params"]]
    reference = torch_muon(theirs, like=muon)
    for step in range(3):
        take_step(reference, step)
    with torch.no_grad():
        for p, q in zip(muon.param_groups[0]["params"], theirs):
            p.copy_(q)
    saved = copy.deepcopy(reference.state_dict())  # (it holds the live buffers)
    params = muon.state_dict()["param_groups"]
    muon.load_state_dict({"state": saved["state"], "param_groups": params})
    before = [q.clone() for q in theirs]
    for step in range(3, 6):
        take_step(muon, step)
        take_step(reference, step)
    assert_close_to(muon.param_groups[0]["params"], theirs, before)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_any_gpt_trains_with_it_as_with_torch_muon(config):
    # configure_optimizers' [AdamW, Muon] on real gradients, against the same run with torch's
    # Muon in our Muon's place: the same losses (to rounding, compounded over the steps), falling
    # on a batch seen again and again
    model, muon = gpt_and_muon(config)
    twin = copy.deepcopy(model)
    idx = torch.randint(0, config.vocab_size, (2, config.block_size + 1))
    x = idx[:, :-1]  # (B, T)
    y = idx[:, 1:]  # (B, T)
    losses = {}
    for name, gpt in (("ours", model), ("torch", twin)):
        optimizers = gpt.configure_optimizers(0.1, 1e-3, "cpu", muon_lr=0.02)
        if name == "torch":
            optimizers[-1] = torch_muon(optimizers[-1].param_groups[0]["params"], like=muon)
        losses[name] = []
        for step in range(5):
            _, loss = gpt(x, y)
            gpt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in optimizers:
                for group in opt.param_groups:
                    group["lr"] = 1e-3 * group.get("lr_scale", 1.0)
                opt.step()
            losses[name].append(loss.item())
    assert losses["ours"] == pytest.approx(losses["torch"], rel=1e-3)
    assert losses["ours"][-1] < losses["ours"][0]
