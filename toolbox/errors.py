"""Errors the CLI turns into a message and an exit code instead of a traceback: the training
package's one contract (toolbox_train.contract), which the host shares, not a copy of it."""

from toolbox_train.contract import Terminated, ToolError, UserError, mask_secrets

__all__ = ["Terminated", "ToolError", "UserError", "mask_secrets"]
