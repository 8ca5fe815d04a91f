"""volta-fp4 doctor [MODEL_DIR]: is this machine (and this checkpoint) ready to serve NVFP4 on a V100?"""

from __future__ import annotations

from vllm_volta_fp4.toolkit.doctor import FAIL, format_report, run_doctor

HELP = "check GPU, driver, torch, vLLM, the extension and optionally a checkpoint; one verdict and fix per line"


def add_arguments(parser) -> None:
    parser.add_argument("model_dir", nargs="?", help="NVFP4 model directory to check as well")
    parser.add_argument("--manifest", help="sha256 manifest of the model files (`sha256sum` output or JSON "
                        "{file: hash}); every listed file is hashed and compared")


def run(args) -> int:
    if args.manifest and not args.model_dir:
        raise SystemExit("volta-fp4 doctor: --manifest needs MODEL_DIR")
    findings = run_doctor(args.model_dir, args.manifest)
    print(format_report(findings))
    return 1 if any(finding.status == FAIL for finding in findings) else 0
