"""dfp.torch.convert: swap a torch model's Conv2d and Linear layers for dfp's, in place."""
import warnings

import torch
import torch.nn as nn

from .layers import Conv2d, Linear, conv2d_unsupported, make_policy, matches
from .segment import find_blocks


def _swap(name, module, policy, ctx):
    """The dfp layer that replaces torch layer `module`, sharing its Parameter objects (so an
    optimizer made before the swap keeps updating them), or a reason string when dfp cannot run
    it."""
    if any(p.device.type != "cpu" for p in module.parameters()):
        return "its parameters are not on the CPU"
    if type(module) is nn.Conv2d:
        why = conv2d_unsupported(module)
        if why:
            return why
        new = Conv2d(module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,
                     module.dilation, module.groups, module.bias is not None, module.padding_mode,
                     policy=policy, ctx=ctx, name=name)
    else:
        new = Linear(module.in_features, module.out_features, module.bias is not None, policy=policy, ctx=ctx,
                     name=name)
    new.weight = module.weight
    new.bias = module.bias
    new.train(module.training)
    return new


def convert(model, precision="int16", keep_fp32=(), *, policy=None, ctx=None, strict=False, example_input=None,
            **policy_kwargs):
    """Replaces every torch.nn.Conv2d and torch.nn.Linear of `model` (exactly those classes) by a
    dfp.torch layer running in `precision`, in place, and returns the names of the replaced modules
    (model.named_modules() names, in that order).

    The new layers share the old ones' Parameter objects: state_dict keys and values, and any
    optimizer already holding the parameters, stay as they were. keep_fp32: glob patterns on module
    names ('conv1', 'layer4.*', 'fc') of layers to leave as torch's own FP32 modules. policy /
    policy keywords (headroom=, rounding=, weights_rounding=, overrides=, ...) as for
    dfp.torch.Conv2d; the policy's overrides match the module names. ctx: the dfp.Context (default
    dfp.torch.context()). A layer dfp cannot run (dilation, non-square kernels, other padding modes,
    parameters off the CPU) stays torch's, with a warning naming it and the reason; strict=True
    raises ValueError instead. `model` itself may be a Conv2d or Linear only inside a container.

    example_input: a batch (N, C, H, W) as training feeds the model. With it, every block that dfp
    can run whole (a child module taking and returning one feature map: a ResNet stage, a VGG
    `features`) becomes one dfp segment (dfp.torch.segment.Segment): its layers keep dfp's
    blocked layout between them and its BatchNorm, ReLU and adds run in dfp too. Segments are
    listed by their module names among the returned names; the Conv2d and Linear layers outside
    them are swapped one by one as without it."""
    policy = make_policy(precision, policy, **policy_kwargs)
    if type(model) in (nn.Conv2d, nn.Linear):
        raise ValueError("dfp.torch.convert swaps layers inside a model; make a single layer with "
                         "dfp.torch.Conv2d / dfp.torch.Linear instead")
    swapped, replaced = [], {}
    blocks = {}
    if example_input is not None:
        example = torch.as_tensor(example_input).detach().to(torch.float32)
        if example.dim() != 4 or example.shape[0] < 1:
            raise ValueError(f"dfp.torch.convert: example_input of shape {tuple(example.shape)}; expected a batch "
                             "(N, C, H, W) with N >= 1")
        blocks = find_blocks(model, example, policy, ctx, keep_fp32, matches)
    inside = tuple(name + "." for name, _ in blocks.values())
    for name, module in list(model.named_modules()):
        if id(module) in blocks:
            replaced[id(module)] = blocks[id(module)][1]
            swapped.append(name)
            continue
        if type(module) not in (nn.Conv2d, nn.Linear) or matches(name, keep_fp32) or name.startswith(inside):
            continue
        new = _swap(name, module, policy, ctx)
        if isinstance(new, str):
            message = f"dfp.torch.convert: '{name}' ({type(module).__name__}) stays torch's: {new}"
            if strict:
                raise ValueError(message)
            warnings.warn(message, stacklevel=2)
            continue
        replaced[id(module)] = new
        swapped.append(name)
    # Every reference to a replaced module, also where one module object sits in several places.
    for parent in list(model.modules()):
        for attr, child in list(parent._modules.items()):
            if child is not None and id(child) in replaced:
                parent._modules[attr] = replaced[id(child)]
    return swapped
