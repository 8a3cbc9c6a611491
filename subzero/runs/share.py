"""A run's side of inputs stored once per store (:mod:`subzero.storage.shared`).

Before a run stores its inputs, :func:`take` makes each input whose content and
form the store already keeps a reference to the store's copy, so the run does
not write it again; when the run commits, :func:`publish` makes each input it
stored itself the store's copy (or drops it for the copy another run published
meanwhile).  An input is digested before the run only when the store keeps some
input of the same form (dims, attributes, chunks), so the first run of a store
pays nothing for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from subzero.model.labelled import is_dataarray
from subzero.storage.arrays import ArrayStore, value_form
from subzero.storage.inputs import input_digest
from subzero.storage.shared import SharedInputs


def _sharing(arrays: ArrayStore, store_uid: str | None) -> bool:
    """Whether the run can share: it and its store have uids, and they agree."""
    return arrays.run_uid is not None and store_uid is not None and arrays.store_uid() == store_uid


def take(arrays: ArrayStore, values: Mapping[str, Any], store_uid: str | None) -> dict[str, str]:
    """Reference the store's copy of every input it keeps; returns the content digests
    computed on the way (name -> digest), shared or not."""
    if not _sharing(arrays, store_uid):
        return {}
    pool = SharedInputs(arrays.root)
    try:
        names = os.listdir(pool.dir)
    except OSError:
        return {}
    forms = {n.removesuffix(".zarr").rsplit("-", 1)[-1] for n in names
             if n.endswith(".zarr") and not n.startswith(".")}
    if not forms:
        return {}
    digests: dict[str, str] = {}
    for name, v in values.items():
        if arrays.is_shared(name):
            continue                   # referenced already (a re-run's unchanged input)
        form = value_form(v, name, arrays.tile)
        if form not in forms:
            continue
        digest = digests[name] = input_digest(v, name)
        with pool.lock():
            if pool.has(digest, form):
                # operators see it as they would have seen the run's own copy: a DataArray
                # as a DataArray, anything else (arrays, inputs read by region) as numpy
                arrays.refer(name, digest, form, numpy=not is_dataarray(v))
    return digests


def publish(arrays: ArrayStore, contents: Mapping[str, str | None], store_uid: str | None) -> None:
    """At commit: every input the run stored itself, whose digest is known, becomes the
    store's copy (or is dropped for the store's copy of the same content and form)."""
    if not _sharing(arrays, store_uid):
        return
    assert store_uid is not None
    pool = SharedInputs(arrays.root)
    with pool.lock():
        for name, digest in contents.items():
            if arrays.is_shared(name):
                arrays.drop_own(name)     # left by a commit cut short after the reference
                continue
            if digest is None:
                continue
            form = arrays.form(name)
            numpy = arrays.seen_as_numpy(name)
            pool.publish(arrays.path(name), digest, form, store_uid, arrays.label(name))
            arrays.refer(name, digest, form, numpy)
