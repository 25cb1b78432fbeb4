"""Chapter 0.2's CIFAR-10 training script: plain and correct, nothing more.

This is the starting point of the chapter 0.4 homework. It trains and prints, but
it has no seed, no checkpoint, no clipping, no EMA and no logging beyond print: kill it and
the run is gone. Upgrade it in five commits (see 10_homework.ipynb).

    python notebooks/homework/train_cifar.py --epochs 1
"""
import argparse

import torch
import torch.nn.functional as F

from course_utils.data import load_cifar10
from course_utils.models import build_model


def main():
    parser = argparse.ArgumentParser(description="Plain CIFAR-10 training (chapter 0.2 baseline)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = load_cifar10(train=True, augment=True)
    test_set = load_cifar10(train=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=512)

    model = build_model("small").to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % 20 == 0:
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")

        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in test_loader:
                x, y = x.to(device), y.to(device)
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        print(f"epoch {epoch} test accuracy {correct / total:.4f}")


if __name__ == "__main__":
    main()
