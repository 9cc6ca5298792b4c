#!/bin/sh
# A fresh MariaDB in /var/lib/mysql (the container's tmpfs), socket in /run/mysqld, as the user running this.
# Extra mariadbd options may follow (docker run IMAGE --option ...). Administrator: root@localhost by the
# unix_socket plugin, i.e. a client running as root on the socket's side (the host: the container runs none).
set -eu
datadir=/var/lib/mysql/data
mariadb-install-db --no-defaults --datadir="$datadir" --skip-test-db --auth-root-authentication-method=socket \
    >/tmp/install-db.log 2>&1 || { cat /tmp/install-db.log >&2; exit 1; }
exec mariadbd --no-defaults --datadir="$datadir" --socket=/run/mysqld/mysqld.sock --pid-file=/tmp/mariadbd.pid \
    --skip-networking --skip-log-bin --secure-file-priv=/var/empty-sql-files --local-infile=0 \
    --character-set-server=utf8mb4 --innodb-buffer-pool-size=64M --max-connections=500 --tmpdir=/tmp "$@"
