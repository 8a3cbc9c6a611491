"""Whether a value is labelled (an ``xarray.DataArray``), asked without importing xarray.

xarray (and pandas under it) costs most of a second to import.  A command that
reads and traces numpy arrays should not pay that, and no value can be a
DataArray unless something has imported xarray already: so the check looks in
``sys.modules`` first.  Code that *makes* labelled values imports xarray itself,
where it does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import xarray as xr
    from typing_extensions import TypeIs


def is_dataarray(value: Any) -> TypeIs[xr.DataArray]:
    """``isinstance(value, xarray.DataArray)``, without importing xarray."""
    xr = sys.modules.get("xarray")
    return xr is not None and isinstance(value, xr.DataArray)
