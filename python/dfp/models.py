"""The model zoo: dfp.models.names() lists the architectures dfp.Model.from_zoo builds."""
from . import _dfp


def names():
    """The zoo's architecture names (lenet, resnet20, resnet18, vgg11, alexnet, googlenet, ...)."""
    return list(_dfp.model_names())


def build(name, channels, height, width, classes, ctx):
    """Same as dfp.Model.from_zoo: the architecture `name` with its input and loss, not yet built."""
    return _dfp.Model.from_zoo(name, channels, height, width, classes, ctx)
