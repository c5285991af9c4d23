"""nodewarden: dispatches containers onto cloud VMs and side nodes; powers nodes off and on only when evidence proves it safe."""

import warnings

__version__ = "0.1.0"

# recent cryptography releases (51.0 here) deprecate their DSA types, and asyncssh (2.24) names them at import:
# five warnings on stderr before every command's first line. nodewarden never offers or
# accepts DSA keys; only warnings attributed to asyncssh's own modules are silenced.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
