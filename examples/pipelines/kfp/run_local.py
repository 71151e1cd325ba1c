"""Run the KFP reference pipeline on this machine with ``kfp.local`` (no cluster, no Docker):
each launcher step is a local subprocess that runs its stage through torchx on ``local_cwd``.

    python examples/pipelines/kfp/run_local.py --out ./out-kfp
"""

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="out-kfp")
    parser.add_argument("--j", default="1:2x1")
    parser.add_argument("--epochs", default="20")
    parser.add_argument("--limit", default="0")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHX_HOME", str(out / "torchx_home"))
    os.environ.setdefault("TORCHX_TRACKERS", "mlflow")
    os.environ.setdefault("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{out / 'mlflow.db'}")

    import kfp.local

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_pipeline import reference_pipeline

    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(out / "kfp_root")
    )
    reference_pipeline(
        base_dir=str(out / "pipeline"), j=args.j, epochs=args.epochs, limit=args.limit
    )
    metrics = json.loads((out / "pipeline" / "eval" / "metrics.json").read_text())
    print(f"test accuracy: {metrics['test_accuracy']:.4f}")
    print(f"MLflow: mlflow ui --backend-store-uri {os.environ['TORCHX_TRACKER_MLFLOW_CONFIG']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
