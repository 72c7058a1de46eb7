
use builtin;
use str;

set edit:completion:arg-completer[lockrun] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'lockrun'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'lockrun'= {
            cand -u 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --url 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --tls-ca 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with'
            cand --replicas 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)'
            cand --prefix 'Key namespace on the server'
            cand -c 'Run this string with /bin/sh -c'
            cand --command 'Run this string with /bin/sh -c'
            cand -t 'Lease length, e.g. 500ms, 30s, 2m, "1h 30m"'
            cand --ttl 'Lease length, e.g. 500ms, 30s, 2m, "1h 30m"'
            cand -w 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock''s -w takes it'
            cand --wait 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock''s -w takes it'
            cand --timeout 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock''s -w takes it'
            cand --limit 'Up to N holders at once (a counting semaphore); each job gets its place 0..N-1 in LOCKRUN_SLOT. Every user of the name must agree on N'
            cand -E 'Exit code when the lock was not acquired: 0 to 255 but 76 (-E 0 skips quietly, as with flock -n -E 0 in a crontab)'
            cand --conflict-exit-code 'Exit code when the lock was not acquired: 0 to 255 but 76 (-E 0 skips quietly, as with flock -n -E 0 in a crontab)'
            cand --label 'A note shown by `status` and in waiting messages beside host:pid (a pipeline id, a ticket)'
            cand --metrics-file 'At the end of every run (skipped, ran, lost, failed) replace PATH, atomically, with Prometheus text for node_exporter''s textfile collector: end time, acquired, wait and hold seconds, exit code, lease lost, token. A PATH that cannot be written costs one warning, never the job or its exit code'
            cand --kill-after 'Grace between SIGTERM and SIGKILL when the job must stop (default: ttl/10)'
            cand --min-hold 'Keep the lock held at least DUR after it was granted, also once the job ended, counted on the engine''s clock: a crontab line on several hosts then runs once per window. A longer job releases at its end'
            cand --max-waiters 'Wait only while fewer than N requests of this name wait; otherwise give up at once with the conflict code (-E). --max-waiters 1 coalesces: the running job plus one queued run'
            cand -v 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand --verbose 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand -q 'Print only errors'
            cand --quiet 'Print only errors'
            cand -n 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)'
            cand --no-wait 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)'
            cand --nonblock 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)'
            cand --nb 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)'
            cand -x 'An exclusive lock, the default (as flock''s -x and -e)'
            cand --exclusive 'An exclusive lock, the default (as flock''s -x and -e)'
            cand -s 'A shared (reader) lock, as flock''s -s: shared holders run together, never beside an exclusive one'
            cand --shared 'A shared (reader) lock, as flock''s -s: shared holders run together, never beside an exclusive one'
            cand --supersede 'Replace the waiting requests of this name that asked for --supersede too (newest wins); each replaced one gives up with the conflict code. Holders and other waiters are never touched'
            cand --preempt 'Ask the holders of this name to stop: each stops its job at its next renewal (TERM, grace, KILL) and exits 76; then wait our turn, so the job starts only once every process of theirs is gone'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand status 'Show whether NAME is held; without NAME (or as `list`), every name'
            cand list 'Show whether NAME is held; without NAME (or as `list`), every name'
            cand release 'Break a lock (operators)'
            cand doctor 'Check an engine before the first incident, read-only'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'lockrun;status'= {
            cand -u 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --url 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --tls-ca 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with'
            cand --replicas 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)'
            cand --prefix 'Key namespace on the server'
            cand --json 'Print one JSON object (without NAME: an array of them) instead of text'
            cand -v 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand --verbose 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand -q 'Print only errors'
            cand --quiet 'Print only errors'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'lockrun;list'= {
            cand -u 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --url 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --tls-ca 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with'
            cand --replicas 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)'
            cand --prefix 'Key namespace on the server'
            cand --json 'Print one JSON object (without NAME: an array of them) instead of text'
            cand -v 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand --verbose 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand -q 'Print only errors'
            cand --quiet 'Print only errors'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'lockrun;release'= {
            cand --token 'Break only the holder with token T (default: every holder)'
            cand -u 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --url 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --tls-ca 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with'
            cand --replicas 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)'
            cand --prefix 'Key namespace on the server'
            cand --force 'Required: breaking a lock someone holds is deliberate'
            cand --now 'Delete the lease at once and wake a waiter. Unsafe without fencing: the old job may still be running when the next one starts'
            cand -v 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand --verbose 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand -q 'Print only errors'
            cand --quiet 'Print only errors'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'lockrun;doctor'= {
            cand -u 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --url 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine'
            cand --tls-ca 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with'
            cand --replicas 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)'
            cand --prefix 'Key namespace on the server'
            cand -v 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand --verbose 'Timestamped progress on stderr (-vv also shows every renewal)'
            cand -q 'Print only errors'
            cand --quiet 'Print only errors'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'lockrun;help'= {
            cand status 'Show whether NAME is held; without NAME (or as `list`), every name'
            cand list 'Show whether NAME is held; without NAME (or as `list`), every name'
            cand release 'Break a lock (operators)'
            cand doctor 'Check an engine before the first incident, read-only'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'lockrun;help;status'= {
        }
        &'lockrun;help;list'= {
        }
        &'lockrun;help;release'= {
        }
        &'lockrun;help;doctor'= {
        }
        &'lockrun;help;help'= {
        }
    ]
    $completions[$command]
}
