"""Input checks shared by the algorithm functions.

The losses are called deep inside a training step where a silently broadcast shape (a [B] tensor
meeting a [B, T] one the wrong way round) gives a wrong but finite loss. These checks turn such
mistakes into errors that name the argument and the expected shape.

Shape suffixes: B = sequences, T = completion tokens per sequence (padded).
"""

import torch


def check_same_shape(reference_name: str, reference: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Raise if any tensor in `others` differs in shape from `reference`."""
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {reference_name} has shape "
                f"{tuple(reference.shape)}; they must match (both [B, T], padded the same way)."
            )


def check_2d(name: str, tensor: torch.Tensor) -> None:
    """Raise unless `tensor` is [B, T]."""
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be [B, T] (sequences x tokens); got shape {tuple(tensor.shape)}.")


def as_float_mask(mask_BT: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A 0/1 mask in `like`'s dtype, from a bool or 0/1 numeric mask."""
    if mask_BT.dtype == torch.bool:
        return mask_BT.to(like.dtype)
    if not torch.all((mask_BT == 0) | (mask_BT == 1)):
        raise ValueError("mask_BT must be boolean or hold only 0 and 1 (1 = token counts in the loss).")
    return mask_BT.to(like.dtype)


def per_token(name: str, values: torch.Tensor, like_BT: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence [B] tensor to [B, T]; pass a [B, T] one through after a shape check."""
    if values.dim() == 1:
        if values.shape[0] != like_BT.shape[0]:
            raise ValueError(
                f"{name} has {values.shape[0]} entries but there are {like_BT.shape[0]} sequences; "
                "pass one value per sequence ([B]) or per token ([B, T])."
            )
        return values.unsqueeze(-1).expand_as(like_BT)
    check_same_shape("logprobs_BT", like_BT, **{name: values})
    return values
