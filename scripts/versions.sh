# Sourced by the scripts: every component's version from versions.env at
# the top of the checkout, unless the environment names one already (make
# exports its own values, which a command line may override).
eval "$(sed -n 's/^\([A-Z][A-Z0-9_]*\)=\([^[:space:]]*\)$/: "${\1:=\2}"/p' \
  "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/versions.env")"
