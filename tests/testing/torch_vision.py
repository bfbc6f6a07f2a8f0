"""The four classifiers of opfusion.testing.vision written again in plain torch, as
torchvision's source defines them (modules, layer tables, forward passes), with torchvision's
module names so that ``load_state_dict`` takes the ONNX initializers by name.

A second, independent statement of each architecture: the tables here are copied from
torchvision, not imported from opfusion, and the forward passes use torch's own operators
(``F.hardsigmoid``, ``chunk``, ``transpose``, ``mean``) where the ONNX builds spell them as
ONNX nodes. Only the tests import this, and only when torch is installed."""

import torch
from torch import nn


def make_divisible(value, divisor=8):
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_norm_activation(cin, cout, kernel, stride=1, groups=1, activation=None, eps=1e-5):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), batch norm, activation."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups,
                        bias=False),
              nn.BatchNorm2d(cout, eps=eps)]
    if activation is not None:
        layers.append(activation())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation."""

    def __init__(self, channels, squeeze, activation, scale_activation):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


# -- ResNet-18 ---------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = 64
        for stage, cout in enumerate((64, 128, 256, 512), start=1):
            stride = 1 if stage == 1 else 2
            setattr(self, f"layer{stage}", nn.Sequential(BasicBlock(cin, cout, stride),
                                                         BasicBlock(cout, cout, 1)))
            cin = cout
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# -- MobileNet v3 large ------------------------------------------------------------------------

# input, kernel, expanded, output channels, squeeze-excitation, activation, stride
MOBILENET_V3_LARGE = [
    (16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2),
    (24, 3, 72, 24, False, "RE", 1), (24, 5, 72, 40, True, "RE", 2),
    (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
    (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1),
    (80, 3, 184, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
    (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
    (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1),
    (160, 5, 960, 160, True, "HS", 1),
]


class MobileNetV3Block(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, use_se, activation, stride):
        super().__init__()
        act = nn.Hardswish if activation == "HS" else nn.ReLU
        layers = []
        if expanded != cin:
            layers.append(conv_norm_activation(cin, expanded, 1, activation=act, eps=0.001))
        layers.append(conv_norm_activation(expanded, expanded, kernel, stride, groups=expanded,
                                           activation=act, eps=0.001))
        if use_se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4), nn.ReLU,
                                            nn.Hardsigmoid))
        layers.append(conv_norm_activation(expanded, cout, 1, eps=0.001))
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x):
        result = self.block(x)
        return result + x if self.use_res_connect else result


class MobileNetV3Large(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [conv_norm_activation(3, 16, 3, 2, activation=nn.Hardswish, eps=0.001)]
        layers += [MobileNetV3Block(*cnf) for cnf in MOBILENET_V3_LARGE]
        layers.append(conv_norm_activation(160, 960, 1, activation=nn.Hardswish, eps=0.001))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(),
                                        nn.Dropout(0.2), nn.Linear(1280, 1000))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- EfficientNet-B0 ---------------------------------------------------------------------------

# expand ratio, kernel, stride, input, output channels, layers
EFFICIENTNET_B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
                   (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
                   (6, 3, 1, 192, 320, 1)]


class MBConv(nn.Module):
    def __init__(self, expand, kernel, stride, cin, cout):
        super().__init__()
        expanded = make_divisible(cin * expand)
        layers = []
        if expanded != cin:
            layers.append(conv_norm_activation(cin, expanded, 1, activation=nn.SiLU))
        layers.append(conv_norm_activation(expanded, expanded, kernel, stride, groups=expanded,
                                           activation=nn.SiLU))
        layers.append(SqueezeExcitation(expanded, max(1, cin // 4), nn.SiLU, nn.Sigmoid))
        layers.append(conv_norm_activation(expanded, cout, 1))
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x):
        result = self.block(x)  # stochastic depth is the identity in eval mode
        return result + x if self.use_res_connect else result


class EfficientNetB0(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [conv_norm_activation(3, 32, 3, 2, activation=nn.SiLU)]
        for expand, kernel, stride, cin, cout, count in EFFICIENTNET_B0:
            layers.append(nn.Sequential(*[
                MBConv(expand, kernel, stride if i == 0 else 1, cin if i == 0 else cout, cout)
                for i in range(count)]))
        layers.append(conv_norm_activation(320, 1280, 1, activation=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- ShuffleNet v2 x1.0 ------------------------------------------------------------------------


def channel_shuffle(x, groups):
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width)
    return torch.transpose(x, 1, 2).contiguous().view(batch, -1, height, width)


class ShuffleBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())
        self.branch2 = nn.Sequential(
            nn.Conv2d(cin if stride > 1 else half, half, 1, bias=False), nn.BatchNorm2d(half),
            nn.ReLU(),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2X10(nn.Module):
    def __init__(self, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024)):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, channels[0], 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(channels[0]), nn.ReLU())
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = channels[0]
        for stage, count, cout in zip((2, 3, 4), repeats, channels[1:]):
            blocks = [ShuffleBlock(cin, cout, 2)]
            blocks += [ShuffleBlock(cout, cout, 1) for _ in range(count - 1)]
            setattr(self, f"stage{stage}", nn.Sequential(*blocks))
            cin = cout
        self.conv5 = nn.Sequential(nn.Conv2d(cin, channels[-1], 1, bias=False),
                                   nn.BatchNorm2d(channels[-1]), nn.ReLU())
        self.fc = nn.Linear(channels[-1], 1000)

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        x = self.conv5(self.stage4(self.stage3(self.stage2(x))))
        return self.fc(x.mean([2, 3]))


TORCH_MODELS = {
    "efficientnet_b0": EfficientNetB0,
    "mobilenet_v3_large": MobileNetV3Large,
    "resnet18": ResNet18,
    "shufflenet_v2_x1_0": ShuffleNetV2X10,
}
