"""A bare loop in nanoGPT's style, written here: random windows drawn with the global generator (``get_batch``),
the lr computed from the iteration number, an evaluation every few iterations, and a checkpoint of the model,
the optimizer and ``iter_num`` written after it; ``--resume`` loads it and goes on from ``iter_num``.

    python nanogpt_run.py --out runs/n [--resume]
"""

import torch

from task import BATCH, CONTEXT, EPOCHS, WINDOWS, TinyLM, TokenWindows, command_line, lm_loss, lr_factor

MAX_ITERS, EVAL_INTERVAL, EVAL_ITERS = EPOCHS * WINDOWS // BATCH, 4, 2


def get_batch(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(tokens) - CONTEXT - 1, (BATCH,))
    return (torch.stack([tokens[i:i + CONTEXT] for i in ix]), torch.stack([tokens[i + 1:i + 1 + CONTEXT] for i in ix]))


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    model.eval()
    losses = [lm_loss(model, *get_batch(tokens)).item() for _ in range(EVAL_ITERS)]
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    args = command_line()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1337)
    tokens = TokenWindows(WINDOWS, seed=0).tokens
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    iter_num = 0
    if args.resume and (out / "ckpt.pt").exists():
        checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = checkpoint["iter_num"]
    while iter_num < MAX_ITERS:
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * lr_factor(iter_num, MAX_ITERS)
        loss = lm_loss(model, *get_batch(tokens))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        iter_num += 1
        if iter_num % EVAL_INTERVAL == 0:
            print(f"iter {iter_num}: val loss {estimate_loss(model, tokens):.4f}", flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num},
                       out / "ckpt.pt")


if __name__ == "__main__":
    main()
