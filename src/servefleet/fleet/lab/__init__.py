"""The local lab fleet: systemd + sshd hosts in network namespaces, with the lab's own package
sources, built by the simulator (``simulator/``: sources shipped as package data, not imported)
from a strict simulation of the RBLN stack (driver, rbln-smi, rebel, vllm)."""
