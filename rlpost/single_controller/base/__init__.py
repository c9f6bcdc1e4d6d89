"""Ray-free parts of the single controller: the `Worker` base class and `@register`."""

from rlpost.single_controller.base.decorator import Dispatch, Execute, register
from rlpost.single_controller.base.worker import Worker

__all__ = ["Dispatch", "Execute", "Worker", "register"]
