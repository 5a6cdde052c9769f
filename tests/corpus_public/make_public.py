"""Write tests/corpus_public/: incident bundles built from failure logs that people posted in
public issue threads, each labelled with what its thread concluded (README.md says how).

The log lines are copied as posted (only markdown emphasis and quoting marks removed); the job's
Slurm record (job.json) is scaffolding: a FAILED job (or the state the thread describes) on the
hosts the log names, ``node01`` where it names none. Deterministic: rerun with
``python tests/corpus_public/make_public.py``; it rewrites every ``NN-*`` directory and README's
table.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OBSERVED = "2026-12-05T12:00:00Z"


@dataclass
class Case:
    slug: str
    source: str
    concluded: str
    category: str
    action: str
    why: str
    log: list[str]
    nodes: list[str] = field(default_factory=lambda: ["node01"])
    culprits: list[str] = field(default_factory=list)
    node_logs: dict[str, list[str]] = field(default_factory=dict)
    state: str = "FAILED"
    classes: str = ""


CASES = [
    Case(
        "infra-nccl-shm-docker-xgboost",
        "https://github.com/dmlc/xgboost/issues/5963",
        "posix_fallocate fails because /dev/shm has no room: Docker gives a container 64 MB; "
        "raising --shm-size fixed the multi-GPU tests",
        "infrastructure",
        "restart",
        "NCCL could not create its shared-memory segment: node-local /dev/shm too small.",
        [
            "7635c25c81cd:41590:41835 [0] NCCL INFO Channel 00 : 3[1c0] -> 2[1b0] via direct "
            "shared memory",
            "7635c25c81cd:41588:41837 [0] NCCL INFO include/shm.h:41 -> 2",
            "7635c25c81cd:41588:41837 [0] include/shm.h:48 NCCL WARN Error while creating shared "
            "memory segment nccl-shm-recv-6c6b02bad5bfc129-0-1-0 (size 9637888)",
            "7635c25c81cd:41585:41836 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate "
            "failed : No space left on device",
            "7635c25c81cd:41585:41836 [0] NCCL INFO include/shm.h:41 -> 2",
            "7635c25c81cd:41585:41836 [0] include/shm.h:48 NCCL WARN Error while creating shared "
            "memory segment nccl-shm-recv-bade85d1d321b26-0-3-2 (size 9637888)",
        ],
        nodes=["7635c25c81cd"],
        classes="NCCL /dev/shm (2.4-2.11 form)",
    ),
    Case(
        "infra-nccl-shm-2-7-3-docker",
        "https://github.com/NVIDIA/nccl/issues/342",
        "the /dev/shm size limit of Docker (64 MB); increasing it made everything work",
        "infrastructure",
        "restart",
        "NCCL 2.7.3 picked shared memory and the container's /dev/shm was too small.",
        [
            "include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No space left on device",
            "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
            "nccl-shm-recv-250a7cc850ba9298-0-1-3 (size 9637888)",
        ],
        classes="NCCL /dev/shm (2.7 form, no space before the colon)",
    ),
    Case(
        "infra-nccl-shm-kubeflow",
        "https://github.com/NVIDIA/nccl/issues/525",
        "maintainer: /dev/shm is likely full; the fix is a memory-backed /dev/shm volume (or "
        "NCCL_SHM_DISABLE=1)",
        "infrastructure",
        "restart",
        "Shared-memory segment creation failed on the pod's /dev/shm.",
        [
            "[3] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on "
            "device",
            "[3] NCCL INFO include/shm.h:41 -> 2",
            "[3] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
            "nccl-shm-recv-1462445a6f01cbfc-1-2-3 (size 9637888)",
        ],
        classes="NCCL /dev/shm (Kubernetes)",
    ),
    Case(
        "infra-nccl-shm-shmutils-ci-runner",
        "https://github.com/pytorch/ci-infra/pull/490",
        "the workflow pods' /dev/shm was too small; the PR mounts a tmpfs /dev/shm",
        "infrastructure",
        "restart",
        "NCCL 2.2x (misc/shmutils.cc) could not extend its /dev/shm file: no space.",
        [
            "[2026-04-22 21:34:20] mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:"
            "202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend "
            "/dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device (28)",
            "[2026-04-22 21:34:20] mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:"
            "202016:202235 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory "
            "segment /dev/shm/nccl-WU88OE (size 9637888), error: No space left on device (28)",
            "mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:202016:202235 [0] NCCL INFO "
            "transport/shm.cc:551 -> 2",
            "[2026-04-22 21:34:20] mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:"
            "202016:202238 [2] proxy.cc:1326 NCCL WARN Socket recv failed",
        ],
        nodes=["mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow"],
        classes="NCCL /dev/shm (2.2x shmutils form with errno)",
    ),
    Case(
        "infra-nccl-tests-docker-ipc",
        "https://github.com/NVIDIA/nccl/issues/473",
        "a problem of shared memory in Docker; running the container with --ipc=host fixed it",
        "infrastructure",
        "restart",
        "nccl-tests reports an unhandled system error; the thread traced it to the container's "
        "shared memory. The log alone (no NCCL_DEBUG) does not say so.",
        [
            "# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
            "iters: 20 validation: 1 ",
            "#",
            "# Using devices",
            "#   Rank  0 Pid   1688 on    fastmoe device  0 [0x18] GeForce RTX 2080 Ti",
            "#   Rank  1 Pid   1688 on    fastmoe device  1 [0x3b] GeForce RTX 2080 Ti",
            "fastmoe: Test NCCL failure common.cu:777 'unhandled system error'",
        ],
        nodes=["fastmoe"],
        classes="nccl-tests failure line (host form)",
    ),
    Case(
        "infra-nccl-tests-docker-network",
        "https://github.com/NVIDIA/nccl-tests/issues/14",
        "no usable network interface inside the container ('Socket creation failed'); running "
        "with --net host solved it",
        "infrastructure",
        "restart",
        "The benchmark's old failure form, then NCCL's own WARN lines (2018, no 'NCCL' word).",
        [
            "nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
            "iters: 20 validation: 1",
            "NCCL failure common.cu:874 'unhandled system error'",
            "e66aa18dc444:3171:3171 [0] misc/ibvwrap.cu:61 WARN Failed to open libibverbs.so[.1]",
            "e66aa18dc444:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : "
            "Address family not supported by protocol",
        ],
        nodes=["e66aa18dc444"],
        classes="nccl-tests failure line (2018 form)",
    ),
    Case(
        "infra-port-in-use-megatron",
        "https://github.com/NVIDIA/Megatron-LM/issues/343",
        "the rendezvous port was already in use; use a different MASTER_PORT",
        "infrastructure",
        "restart",
        "TCPStore could not bind MASTER_PORT: another process holds it.",
        [
            'File "/megatron/initialize.py", line 181, in _initialize_distributed',
            "torch.distributed.init_process_group(",
            'File "/root/miniconda3/lib/python3.8/site-packages/torch/distributed/'
            'distributed_c10d.py", line 520, in init_process_group',
            "store, rank, world_size = next(rendezvous_iterator)",
            'File "/root/miniconda3/lib/python3.8/site-packages/torch/distributed/rendezvous.py", '
            "line 142, in _tcp_rendezvous_handler",
            "store = TCPStore(result.hostname, result.port, world_size, start_daemon, timeout)",
            "RuntimeError: Address already in use",
        ],
        classes="rendezvous port in use (PyTorch 1.x form)",
    ),
    Case(
        "infra-port-in-use-another-run",
        "https://github.com/pytorch/pytorch/issues/126510",
        "typically another torchrun on the same machine holds the port, sometimes a zombie process",
        "infrastructure",
        "restart",
        "The c10d store's bind failed on both address families (errno 98).",
        [
            "[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29400 (errno: "
            "98 - Address already in use).",
            "[W socket.cpp:436] [c10d] The server socket has failed to bind to 0.0.0.0:29400 "
            "(errno: 98 - Address already in use).",
            "[E socket.cpp:472] [c10d] The server socket has failed to listen on any local network "
            "address.",
        ],
        classes="rendezvous port in use (PyTorch 1.10-2.3 form)",
    ),
    Case(
        "infra-port-in-use-second-training",
        "https://github.com/om-ai-lab/VLM-R1/issues/289",
        "a first training process held port 29500 when a second one was started",
        "infrastructure",
        "restart",
        "The libuv store (PyTorch >= 2.4) reports EADDRINUSE on 29500.",
        [
            "RuntimeError: The server socket has failed to listen on any local network address. "
            "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in "
            "use.",
        ],
        classes="rendezvous port in use (PyTorch >= 2.4 form)",
    ),
    Case(
        "infra-checkpoint-write-shared-fs",
        "https://github.com/rwth-i6/returnn/issues/1829",
        "a transient shared-filesystem error (a Lustre/NFS RPC error) or a brief quota bounce "
        "failed one checkpoint write; a second attempt succeeds",
        "infrastructure",
        "restart",
        "torch.save's writer failed on the shared file system while saving a checkpoint.",
        [
            "Traceback (most recent call last):",
            '  File ".../torch/serialization.py", line 965, in save',
            "    _save(obj, opened_zipfile, ...)",
            '  File ".../torch/serialization.py", line 1266, in _save',
            "    zip_file.write_record(name, storage, num_bytes)   # name='data/322', "
            "num_bytes=16777216",
            "RuntimeError: [enforce fail at inline_container.cc:857] . PytorchStreamWriter failed "
            "writing file data/322: file write failed",
            "",
            "During handling of the above exception, another exception occurred:",
            "  ...",
            '  File ".../returnn/torch/engine.py", line 700, in Engine.train_epoch',
            "    self._save_model()",
        ],
        classes="file-system error at checkpoint",
    ),
    Case(
        "infra-checkpoint-disk-full-io-error",
        "https://github.com/pytorch/pytorch/issues/10577",
        "the server's disk was full; after freeing space the save worked",
        "infrastructure",
        "restart",
        "PyTorch 1.0's serializer reports the failed write of a checkpoint (EIO).",
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 250, in <module>',
            '    torch.save(best_model.state_dict(), join(OUTD, "best_model.pt"))',
            '  File "/home/user290/Venvs/pytorch.1.0.1/lib/python3.7/site-packages/torch/'
            'serialization.py", line 297, in _save',
            "    serialized_storages[key]._write_file(f, _should_read_directly(f))",
            "RuntimeError: write(): fd 29 failed with Input/output error",
        ],
        classes="file-system error at checkpoint (PyTorch 1.0 form)",
    ),
    Case(
        "gpu-nvrm-reset-required-nccl-tests",
        "https://github.com/scitix/sichek/issues/51",
        "GPU1 was in an unrecoverable state at the driver/GSP layer (NV_ERR_RESET_REQUIRED); "
        "tests without GPU1 passed",
        "gpu_hardware",
        "isolate_and_restart",
        "The node's kernel log reports a GPU that needs a reset, without an Xid; the job only "
        "sees a busy device.",
        [
            "Test CUDA failure common.cu:1007",
            "'CUDA-capable device(s) is/are busy or unavailable'",
        ],
        culprits=["node01"],
        node_logs={
            "node01": [
                "[Sun Jan 11 09:52:01 2026] NVRM: rpcRmApiAlloc_GSP: GspRmAlloc failed: "
                "hClient=0xc1d1a616; hParent=0x5c000054; hObject=0x5c00005b; hClass=0x0000c86f; "
                "paramsSize=0x00000170; paramsStatus=0x00000062; status=0x00000062 ",
                "[Sun Jan 11 09:52:01 2026] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset "
                "required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ "
                "kernel_channel.c:2874 ",
            ]
        },
        classes="NVRM error without an Xid (reset required)",
    ),
    Case(
        "gpu-nvrm-reset-required-gb200",
        "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/982",
        "a GB200 node had one bad GPU; dmesg showed NV_ERR_RESET_REQUIRED",
        "gpu_hardware",
        "isolate_and_restart",
        "The kernel log's reset-required assertion convicts the node; the job's CUDA error "
        "points at it.",
        [
            "Traceback (most recent call last):",
            '  File "<stdin>", line 1, in <module>',
            "torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
            "Search for `cudaErrorDevicesUnavailable' in https://docs.nvidia.com/cuda/"
            "cuda-runtime-api/group__CUDART__TYPES.html for more information.",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        ],
        culprits=["node01"],
        node_logs={
            "node01": [
                "[373871.354096] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required "
                "[NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2827",
            ]
        },
        classes="NVRM error without an Xid (reset required)",
    ),
    Case(
        "net-ib-port-error-flapping-link",
        "https://github.com/NVIDIA/nccl/issues/905",
        "maintainer: a log full of 'Got async event : port error' is a flapping link; the "
        "user saw it on several nodes, so the IB fabric needs checking",
        "network",
        "restart",
        "Port errors on several nodes: a fabric problem, no node singled out.",
        ["NCCL WARN NET/IB : Got async event : port error"],
        nodes=["node01", "node02"],
        classes="older NCCL IB async event (no <dev>:<port>), quoted without its prefix",
    ),
    Case(
        "net-ib-old-async-catastrophic",
        "https://github.com/NVIDIA/nccl/issues/230",
        "not stated (closed without a cause); label from the line: IBV_EVENT_DEVICE_FATAL of "
        "the reporting host's HCA",
        "network",
        "exclude_and_restart",
        "Every rank on one container reports its HCA's local catastrophic error (NCCL 2.4, "
        "Open MPI tagged output); only the job's output names it.",
        [
            "2019-06-02T16:13:44.884Z: [1,12]<stdout>:container-e275-1553839402050-12124-01-000057"
            ":815:864 [0] transport/net_ib.cu:80 NCCL WARN NET/IB : Got async event : local "
            "catastrophic error",
            "2019-06-02T16:13:44.884Z: [1,12]<stdout>:",
            "2019-06-02T16:13:44.884Z: [1,12]<stdout>:container-e275-1553839402050-12124-01-000057"
            ":815:864 [0] misc/ibvwrap.cu:220 NCCL WARN Call to ibv_get_async_event failed",
            "2019-06-02T16:13:44.888Z: [1,14]<stdout>:",
            "2019-06-02T16:13:44.888Z: [1,14]<stdout>:container-e275-1553839402050-12124-01-000057"
            ":814:868 [0] transport/net_ib.cu:80 NCCL WARN NET/IB : Got async event : local "
            "catastrophic error",
        ],
        nodes=["container-e275-1553839402050-12124-01-000057"],
        culprits=["container-e275-1553839402050-12124-01-000057"],
        classes="older NCCL IB async event (fatal), Open MPI output tags",
    ),
    Case(
        "hang-watchdog-rerun-other-card",
        "https://github.com/MLI-lab/DeepDeWedge/issues/22",
        "the error went away re-running on a different GPU card; no cause named",
        "hang",
        "restart",
        "A collective timed out (30 min) and the watchdog took the process down; nothing names "
        "a node.",
        [
            "[rank1]:[E ProcessGroupNCCL.cpp:523] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=44, OpType=ALLREDUCE, NumelIn=6832129, NumelOut=6832129, "
            "Timeout(ms)=1800000) ran for 1800772 milliseconds before timing out.",
            "[rank1]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. "
            "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run "
            "on corrupted/incomplete data.",
            "[rank1]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the "
            "entire process down.",
        ],
        classes="hang (watchdog)",
    ),
    Case(
        "app-ddp-unused-parameters",
        "https://github.com/microsoft/Cream/issues/4",
        "passing find_unused_parameters=True to DistributedDataParallel solved it",
        "application",
        "hold",
        "DDP's reducer error: the model has parameters that produce no gradient.",
        [
            "RuntimeError: Expected to have finished reduction in the prior iteration before "
            "starting a new one.",
        ],
        classes="application (DDP usage)",
    ),
    Case(
        "app-ddp-unused-parameter-rank0",
        "https://github.com/buxiangzhiren/DDCap/issues/35",
        "maintainer: a parameter is set trainable but unused; set find_unused_parameters=True",
        "application",
        "hold",
        "DDP names the parameter that got no gradient on rank 0.",
        [
            "RuntimeError: Expected to have finished reduction in the prior iteration before "
            "starting a new one. This error indicates that your module has parameters that were "
            "not used in producing loss. You can enable unused parameter detection by passing "
            "the keyword argument `find_unused_parameters=True` to "
            "`torch.nn.parallel.DistributedDataParallel`, and by ",
            "making sure all `forward` function outputs participate in calculating loss. ",
            "Parameter indices which did not receive grad for rank 0: 1",
        ],
        classes="application (DDP usage)",
    ),
    Case(
        "app-ddp-reducer-bug-fixed-upstream",
        "https://github.com/open-mmlab/mmagic/issues/419",
        "maintainer: a bug in the model code, fixed in MMEditing #290",
        "application",
        "hold",
        "The same reducer error, from a bug in the library's model code.",
        [
            "RuntimeError: Expected to have finished reduction in the prior iteration before "
            "starting a new one. This error indicates that your module has parameters that were "
            "not used i",
            "n producing loss. You can enable unused parameter detection by (1) passing the "
            "keyword argument `find_unused_parameters=True` to "
            "`torch.nn.parallel.DistributedDataParallel`;",
        ],
        classes="application (library bug)",
    ),
    Case(
        "infra-oom-gpu-shared-with-another-job",
        "https://github.com/InternLM/InternLM/issues/186",
        "the Slurm nodes were not exclusive: another job used the same GPUs, so the OOM came "
        "and went; exclusive nodes fixed it",
        "infrastructure",
        "restart",
        "A CUDA OOM the job did not cause (another job held the GPU memory); the log alone "
        "reads as the job's own OOM.",
        ["torch.cuda.OutOfMemoryError: CUDA out of memory"],
        classes="GPU memory held by another job (reads as an application OOM)",
    ),
]


def main() -> None:
    for old in HERE.glob("[0-9][0-9]-*"):
        shutil.rmtree(old)
    rows = []
    for no, case in enumerate(CASES, 1):
        name = f"{no:02d}-{case.slug}"
        out = HERE / name
        (out / "logs").mkdir(parents=True)
        job = {
            "cluster": "public",
            "job_id": str(900000 + no),
            "state": case.state,
            "exit_code": "1:0",
            "reason": "NonZeroExitCode",
            "nodes": case.nodes,
            "node_states": dict.fromkeys(case.nodes, "ALLOCATED"),
            "observed_at": OBSERVED,
        }
        (out / "job.json").write_text(json.dumps(job, indent=2) + "\n")
        (out / "logs" / "job.log").write_text("\n".join(case.log) + "\n")
        for node, lines in case.node_logs.items():
            (out / "nodes").mkdir(exist_ok=True)
            (out / "nodes" / f"{node}.log").write_text("\n".join(lines) + "\n")
        expected = {
            "category": case.category,
            "culprit_nodes": sorted(case.culprits),
            "action": case.action,
            "why": case.why,
            "source": case.source,
            "concluded": case.concluded,
        }
        (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
        culprits = ", ".join(case.culprits) or "—"
        rows.append(
            f"| `{name}` | {case.category} | {culprits} | {case.action} | {case.classes} | "
            f"[thread]({case.source}) |"
        )
    readme = (HERE / "README.md").read_text()
    start, end = "<!-- table: written by make_public.py -->", "<!-- /table -->"
    head, rest = readme.split(start)
    _, tail = rest.split(end)
    table = "\n".join(
        [
            "| bundle | category | culprits | action | class | source |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    (HERE / "README.md").write_text(f"{head}{start}\n{table}\n{end}{tail}")


if __name__ == "__main__":
    main()
