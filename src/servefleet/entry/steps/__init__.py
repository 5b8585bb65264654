"""The pyinfra layer: deploy steps as modules, each adding the operations of one part of a
host's plan (:class:`servefleet.hostplan.types.HostPlan`, made in :mod:`.plan` before any
operation is added). :mod:`servefleet.entry.deploys` composes them, in this order on each host:

- :mod:`.errors`: a host that must not serve the recipe fails before any change
- :mod:`.lib`: serve_root, the host programs of ``remote/`` and uv
- :mod:`.driver`: the RBLN driver, when it differs
- :mod:`.release`: the release venv and ``current``
- :mod:`.models`: the serve user and the models
- :mod:`.units` and :mod:`.prewarm`: converge through the health gate, the fleet's pre-warm
- :mod:`.report`: ``servefleet plan`` / ``status`` (no operation)

Beside the steps: :mod:`.facts` and :mod:`.operations` (servefleet's own pyinfra facts and
operations), :mod:`.ensure` (operations added only where the probe found a difference),
:mod:`.credentials` (netrc, token), :mod:`.wheels` (the controller's builds for the host),
:mod:`.wheelhouse` (the offline copy), :mod:`.fleet` (one run's fleet pre-warm roles).

Steps may import the pure core (hostplan, release, ...); the core never imports steps.
"""
