"""Writers for T5X checkpoints in the documented on-disk layouts (test fixtures only: the
library reads these formats, T5X writes them)."""
import os

import numpy as np
from flax import serialization, traverse_util

from speculative_t5.checkpoints.common import flat_params


def write_t5x_legacy(model, ckpt_dir, zarr_min_size=None, version=3):
    """checkpoint_<step>/checkpoint msgpack; arrays with size >= zarr_min_size go to
    tensorstore zarr dirs named target.<path with / -> .>, referenced by relative spec."""
    import tensorstore as ts
    os.makedirs(ckpt_dir, exist_ok=True)
    target = {}
    for key, arr in flat_params(model).items():
        if zarr_min_size is not None and arr.size >= zarr_min_size:
            name = ("target/" + key).replace("/", ".")
            chunks = [max(1, s // 2) for s in arr.shape]
            spec = {"driver": "zarr", "dtype": arr.dtype.name,
                    "kvstore": {"driver": "file", "path": name},
                    "metadata": {"compressor": {"id": "gzip"}, "shape": list(arr.shape),
                                 "chunks": chunks}}
            absolute = dict(spec, kvstore={"driver": "file", "path": os.path.join(ckpt_dir, name)})
            ts.open(absolute, create=True, delete_existing=True).result().write(arr).result()
            target[key] = spec
        else:
            target[key] = arr
    state = {"step": np.int32(100),
             "param_states": {"encoder": {"encoder_norm": {"scale": {"v": np.zeros(3, np.float32)}}}}}
    contents = {"version": version,
                "optimizer": {"target": traverse_util.unflatten_dict(target, sep="/"),
                              "state": state}}
    with open(os.path.join(ckpt_dir, "checkpoint"), "wb") as f:
        f.write(serialization.msgpack_serialize(contents))
    return ckpt_dir


def write_t5x_orbax(model, ckpt_dir, item_dir=True):
    """A T5X orbax checkpoint: train state {'target': params, 'state': {...}}."""
    import orbax.checkpoint as ocp
    params = traverse_util.unflatten_dict(flat_params(model), sep="/")
    path = os.path.join(os.path.abspath(ckpt_dir), "state") if item_dir else os.path.abspath(ckpt_dir)
    with ocp.PyTreeCheckpointer() as ckptr:
        ckptr.save(path, {"target": params, "state": {"step": np.int32(100)}})
    return ckpt_dir
