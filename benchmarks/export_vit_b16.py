"""Export a ViT-B/16 with random weights to ONNX, for benchmarks/compile_time.py (needs torch).

    python benchmarks/export_vit_b16.py vit_b_16.onnx

The architecture is torchvision's ``vit_b_16`` (16x16 patches of a 224x224 image, width 768,
12 encoder layers of 12 heads, MLP 3072, 1000 classes), written out here because torchvision
may not be installable; the weights are seeded random numbers (compile time does not depend
on them). Exported by ``torch.onnx.export`` at opset 17, batch 1."""

from __future__ import annotations

import argparse

import torch
from torch import nn


class EncoderBlock(nn.Module):
    def __init__(self, dim: int = 768, heads: int = 12, mlp: int = 3072) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image: int = 224, patch: int = 16, dim: int = 768, layers: int = 12,
                 heads: int = 12, mlp: int = 3072, classes: int = 1000) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.layers = nn.Sequential(*[EncoderBlock(dim, heads, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.layers(x + self.pos_embedding)
        return self.head(self.ln(x)[:, 0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="where to write the .onnx file")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = VisionTransformer().eval()
    x = torch.randn(1, 3, 224, 224)
    # The TorchScript exporter: the torch.export-based one needs onnxscript as well.
    torch.onnx.export(model, (x,), args.output, input_names=["x"], output_names=["logits"],
                      opset_version=17, dynamo=False)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
