"""The monitoring kit: Prometheus recording and alerting rules rendered with the fleet's
``monitoring_thresholds`` (``rules.yml.tmpl``), a Grafana dashboard of the fleet
(``dashboard.json``), an example ``prometheus.yml`` (``prometheus.yml.tmpl``) and what each metric
they read comes from (vLLM's, from its version's reference data; vllm-router's in
``router-metrics.json``; servefleet's own);
:mod:`servefleet.fleet.monitoring.kit` renders them, ``servefleet init`` writes them into a fleet
repository's ``monitoring/``, ``servefleet monitoring INVENTORY`` renders the rules from its data.
"""
