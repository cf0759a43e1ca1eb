"""The small pipeline the end-to-end tests run: quickstart's backbones on 600/300 Fashion-MNIST
images, MobileNetV2 at 64x64, 8 epochs, rounds of 4 candidates."""
import json
import os


def quickstart(root):
    """pipelines/quickstart.json with its files as absolute paths (usable from any directory)."""
    with open(os.path.join(root, "pipelines", "quickstart.json")) as f:
        doc = json.load(f)
    for split in ("train", "test"):
        for k in ("images", "labels"):
            doc["datasets"][split][k] = os.path.join(root, "pipelines", doc["datasets"][split][k])
    for bb in doc["backbones"]:
        if "onnx" in bb:
            bb["onnx"] = os.path.join(root, "pipelines", bb["onnx"])
    return doc


def small_pipeline(root, name, rounds=2):
    doc = quickstart(root)
    doc["name"] = name
    doc["datasets"]["train"]["limit"] = 600
    doc["datasets"]["test"]["limit"] = 300
    doc["backbones"][0]["input"]["height"] = doc["backbones"][0]["input"]["width"] = 64
    doc["head"]["epochs"] = [8]
    # The tests drive training as a 2-rank MPI program (allreduce, srun --ntasks=2); the
    # quickstart itself trains on one rank, the fastest layout on 2 cores (docs/parallel.md).
    doc["steps"]["train"] = {"module": "dam", "ranks": 2, "mode": "sync"}
    doc["rounds"] = {"max": rounds, "candidates": 4, "top_k": 2, "strategy": "perturb", "seed": 3,
                     "min_delta": 0.0, "patience": 5}
    return doc


def tiny_pipeline(root, name, rounds=2):
    """Two rounds of four candidates on PP-OCRv4 and raw pixels, 400/200 images: every step of
    the workflow, MPI steps included, in about 15 s."""
    doc = small_pipeline(root, name, rounds=rounds)
    doc["datasets"]["train"]["limit"] = 400
    doc["datasets"]["test"]["limit"] = 200
    doc["backbones"] = [b for b in doc["backbones"] if b["name"] in ("ppocrv4", "pixels")]
    return doc


# Where the fine-tuning tests unfreeze MobileNetV2: its last three blocks and the head train.
FINETUNE_FROM = "block_11_expand"


def finetune_pipeline(root, name, ranks=2):
    """Two rounds on MobileNetV2 at 64 x 64, 400/200 images: round 1 trains two heads on frozen
    features, round 2 fine-tunes the best from FINETUNE_FROM with its head, as `ranks` sync ranks."""
    doc = quickstart(root)
    doc["name"] = name
    doc["datasets"]["train"]["limit"] = 400
    doc["datasets"]["test"]["limit"] = 200
    bb = doc["backbones"][0]
    bb["input"]["height"] = bb["input"]["width"] = 64
    bb["train_from"] = FINETUNE_FROM
    doc["backbones"] = [bb]
    doc["head"] = {"type": "softmax", "optimizer": "adam", "lr": [0.001], "l2": [0.0001], "epochs": [3],
                   "batch": 32, "backbone_lr_scale": [0.3]}
    doc["steps"]["train"] = {"module": "dam", "ranks": ranks, "mode": "sync"}
    doc["rounds"] = {"max": 2, "candidates": 2, "top_k": 1, "strategy": "perturb", "seed": 3,
                     "finetune_from_round": 2}
    return doc
