#!/usr/bin/python3
"""rbln-smi: a SIMULATION for the servefleet lab, installed by the lab's simulated driver
runfile as /usr/bin/rbln-smi. Not the Rebellions tool.

``rbln-smi -j`` prints JSON shaped like the real one (KMD_version, devices[] with npu, name,
device, pci.dev, pci.bus_id, memory ...); ``rbln-smi`` prints the table. The devices come from
/etc/rbln-sim/hardware.json ({"sku": "RBLN-CR13", "pci_device": "2130", "devices": 4}), under
$RBLN_SIM_ROOT when that is set (tests only). A mixed host lists one entry per device in
"per_device" ([{"sku": ..., "pci_device": ...}, ...]), each over the host-wide values.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import uuid

KMD_VERSION = "@VERSION@"
MEMORY_GIB = {"RBLN-CR13": 140, "RBLN-CR03": 64, "RBLN-CA25": 64, "RBLN-CA22": 16, "RBLN-CA12": 16}
USAGE = "usage: rbln-smi [-j]\n  -j, --json  print device information as JSON\n"


def _hardware() -> dict:
    root = os.environ.get("RBLN_SIM_ROOT", "")
    path = (
        os.path.join(root, "etc/rbln-sim/hardware.json") if root else "/etc/rbln-sim/hardware.json"
    )
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {"devices": 0}


def devices() -> list[dict]:
    hw = _hardware()
    per_device = hw.get("per_device") or []
    out = []
    for i in range(int(hw.get("devices", 0))):
        dev_hw = {**hw, **(per_device[i] if i < len(per_device) else {})}
        sku = str(dev_hw.get("sku", "RBLN-CR13"))
        total = MEMORY_GIB.get(sku, 16) * 1024**3
        ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{socket.gethostname()}.rbln{i}.servefleet-lab")
        out.append(
            {
                "group_id": "0",
                "npu": i,
                "name": sku,
                "sid": f"SIM{ident.hex[:12].upper()}",
                "uuid": str(ident),
                "device": f"rbln{i}",
                "status": "normal",
                "fw_ver": f"{KMD_VERSION}-sim",
                "pci": {
                    "dev": str(dev_hw.get("pci_device", "2130")),
                    "bus_id": f"0000:{3 + i:02x}:00.0",
                    "numa_node": "0",
                    "link_speed": "32.0GT/s",
                    "link_width": "16",
                },
                "memory": {"used": "0", "total": str(total)},
            }
        )
    return out


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if argv and argv not in (["-j"], ["--json"]):
        sys.stderr.write(USAGE + f"rbln-smi: error: unrecognized arguments: {' '.join(argv)}\n")
        return 2
    devs = devices()
    if argv:
        print(json.dumps({"KMD_version": KMD_VERSION, "devices": devs}, indent=2))
        return 0
    print(f"| Device Information KMD ver: {KMD_VERSION} |")
    print("| NPU | Name | Device | PCI BUS ID | Temp | Power | Perf | Memory(used/total) | Util |")
    for d in devs:
        gib = int(d["memory"]["total"]) / 1024**3
        print(
            f"| {d['npu']} | {d['name']} | {d['device']} | {d['pci']['bus_id']} | 38C | "
            f"100.0W | P14 | 0.0B / {gib:.1f}GiB | 0.0 |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
