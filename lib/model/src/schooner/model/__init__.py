"""schooner.model: Llama-style dense and mixture-of-experts decoders in haliax, loss, FLOP accounting,
tensorstore pytree I/O, HF safetensors interop and sharding."""

from . import presets as presets
from ._accounting import flops_per_token as flops_per_token
from ._accounting import forward_flops_per_token as forward_flops_per_token
from ._accounting import num_active_parameters as num_active_parameters
from ._accounting import num_parameters as num_parameters
from ._attention import attention as attention
from ._attention import reference_attention as reference_attention
from ._checkpoint import load_model as load_model
from ._checkpoint import model_shapes as model_shapes
from ._checkpoint import read_config as read_config
from ._checkpoint import save_model as save_model
from ._config import LlamaConfig as LlamaConfig
from ._config import ModelConfig as ModelConfig
from ._config import MoEConfig as MoEConfig
from ._config import RopeConfig as RopeConfig
from ._config import config_from_dict as config_from_dict
from ._config import config_to_dict as config_to_dict
from ._config import register_config as register_config
from ._config import resolve_compute_dtype as resolve_compute_dtype
from ._io import load_pytree as load_pytree
from ._io import read_pytree_metadata as read_pytree_metadata
from ._io import save_pytree as save_pytree
from ._loss import loss_fn as loss_fn
from ._loss import scalar_metrics as scalar_metrics
from ._loss import target_mask_to_loss_mask as target_mask_to_loss_mask
from ._loss import target_weights as target_weights
from ._loss import token_losses as token_losses
from ._state import trainable_mask as trainable_mask
from ._state import update_router_bias as update_router_bias
from ._transformer import Block as Block
from ._transformer import Transformer as Transformer
from ._transformer import init as init
