"""Hosts with RBLN-CR13 (Rebel100) NPUs."""

serve_recipe = "rbln/gpt-oss-120b"  # verified on RBLN-CR13
driver_version = "3.5.1"  # the KMD that SDK 0.12.0 ships with (rbln-smi shows 3.5.1 on CR13)
