"""The local lab fleet: systemd + sshd hosts in network namespaces, with the lab's own package
sources and a strict simulation of the RBLN stack (driver, rbln-smi, rebel, vllm)."""
