"""Export torchvision classifiers with random weights to ONNX, for benchmarks/models.py and
benchmarks/profile_kinds.py (needs torch and torchvision).

    python benchmarks/export_torchvision.py DIR [swin_t convnext_tiny regnet_y_800mf ...]

Each model is ``torchvision.models.<name>(weights=None)`` (torchvision's own initialization,
seeded), in eval mode, exported by the TorchScript exporter at opset 17 with batch 1 and a
224 x 224 input named ``input``, to ``DIR/<name>.onnx``. Without names: the models the
benchmarks of 2026-11-30 used (``DEFAULT_MODELS``), which opfusion's own test models do not
cover: shifted-window attention (Swin-T), linear layers on images (ConvNeXt-T), grouped
convolutions with squeeze-excitation (RegNetY-800MF, ResNeXt-50), depthwise stacks (MnasNet,
MobileNet v2), Inception (GoogLeNet), fire modules (SqueezeNet 1.1), EfficientNetV2-S.

torchvision's wheel carries compiled operators (``nms`` and kin) built for one torch
release; its models are plain Python. Where those operators do not load into the installed
torch, their fake-tensor registrations fail at import, so this script skips them while it
imports torchvision: the classifiers never call them."""

from __future__ import annotations

import argparse
import os

import torch

#: The models of the 2026-11-30 runs (docs/benchmarks.md, "Nine more torchvision models").
DEFAULT_MODELS = ("convnext_tiny", "swin_t", "regnet_y_800mf", "mnasnet1_0", "mobilenet_v2",
                  "resnext50_32x4d", "googlenet", "squeezenet1_1", "efficientnet_v2_s")


def import_torchvision() -> object:
    """torchvision, imported with its compiled operators' fake registrations skipped (see
    the module docstring)."""
    register_fake = torch.library.register_fake
    torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
    try:
        import torchvision
    finally:
        torch.library.register_fake = register_fake
    return torchvision


def export(name: str, directory: str) -> str:
    """Write ``directory/<name>.onnx`` and return its path."""
    torchvision = import_torchvision()
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    path = os.path.join(directory, f"{name}.onnx")
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), path, opset_version=17,
                          dynamo=False, input_names=["input"], output_names=["output"])
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="where to write the .onnx files")
    parser.add_argument("names", nargs="*", default=list(DEFAULT_MODELS),
                        help="torchvision.models names (default: DEFAULT_MODELS)")
    args = parser.parse_args()
    os.makedirs(args.directory, exist_ok=True)
    for name in args.names:
        print(export(name, args.directory), flush=True)


if __name__ == "__main__":
    main()
