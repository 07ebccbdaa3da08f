#!/bin/bash
set -euo pipefail
cd /app
awk '
  /^[[:space:]]*#/ { next }
  /^\[/ {
    if (section == "database" && !added) { print "timeout = 30"; added = 1 }
    section = substr($0, 2, length($0) - 2)
  }
  section == "database" && /^$/ && !added { print "timeout = 30"; added = 1 }
  section == "server" && $1 == "port" { $0 = "port = 9090" }
  section == "server" && $1 == "workers" { $0 = "workers = 8" }
  $1 == "debug" && $2 == "=" && $3 == "true" { $0 = "debug = false" }
  { print }
  END { if (section == "database" && !added) print "timeout = 30" }
' app.conf > app.conf.new
mv app.conf.new app.conf
