"""flashattn's PTX compiler plugin (libflashattn_ptxc.so, NVIDIA's PTX
compiler library inside). Nothing to call: `import flashattn` finds it here
and names it to libflashattn (FLASHATTN_PTX_COMPILER) unless that variable
is set already; `FLASHATTN_PTX_COMPILER=off` turns it off."""
import os

__version__ = "0.9.0"


def plugin_path():
    """The absolute path of libflashattn_ptxc.so in this package, or None
    when the file is missing (a broken install)."""
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libflashattn_ptxc.so")
    return p if os.path.isfile(p) else None
