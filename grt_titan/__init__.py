"""grt_titan: the Gated Recurrent Transformer (arXiv 2608.15062) as a torchtitan model spec.

`import grt_titan` registers the train spec `grt` and does nothing else.
"""

from grt_titan.spec import register as _register

__version__ = "0.1.0"

_register()
