"""`nodewarden check`: what is wrong with an installation, one line per check, with the fix.

- `result`         -- pure: a check's outcome (✓ / ! / ✗, message, fix), the report, exit code
- `render`         -- pure: the report as aligned lines or JSON
- `operatorconfig` -- the operator config parses
- `kubeapi`        -- kubeconfig, the API server answers, its version, clock skew
- `crds`           -- the four CRDs served (API discovery) at this binary's schema
- `rbac`           -- the operator's identity holds every permission (access reviews)
- `cloud`          -- cloud credentials (a read-only list), image, instance types
- `policies`       -- PowerPolicies valid, the default present, references resolvable
- `nodes`          -- WorkerNode Secrets designated, BMCs and SSH endpoints answer, all
                      through the credential resolver (contact only where it admits)
- `lease`          -- the leader Lease's holder and age
- `live`           -- `--live`: the running operator's /readyz and status API
- `runner`         -- the thin runner: facts gathered once, groups in order
- `cli`            -- the command line, output and exit code
"""
