# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_oubli_global_optspecs
    string join \n store= vault= password-file= on-vault-failure= log-tally= h/help V/version
end

function __fish_oubli_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_oubli_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_oubli_using_subcommand
    set -l cmd (__fish_oubli_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c oubli -n "__fish_oubli_needs_command" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_needs_command" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_needs_command" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_needs_command" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_needs_command" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_needs_command" -s V -l version -d 'Print version'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "init" -d 'Create a new store and its vault'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "put" -d 'Store data under NAME (replacing what NAME held), from SRC or stdin'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "get" -d 'Write the data stored under NAME to DST or stdout'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "rm" -d 'Remove NAME; its data is erased at the next commit (except from snapshots that hold it)'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "ls" -d 'List the stored names'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "snapshot" -d 'Keep read-only versions of the whole store, list and remove them'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "share" -d 'Key shares: second secrets in their own vaults, destroyed out of band'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "redact" -d 'On a live mount: erase a file or directory from the store and from every snapshot'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "commit" -d 'End the epoch now: everything deleted so far becomes unrecoverable'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "purge" -d 'End the epoch now: everything deleted so far becomes unrecoverable'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "status" -d 'Show the epoch, pending deletions, space and vault'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "gc" -d 'Reclaim space from segments that are mostly dead (commits)'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "audit" -d 'Try to recover deleted data as an adversary would, and give a verdict (exit 10 on a leak)'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "fsck" -d 'Read and authenticate everything in the store (exit 7 on problems)'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "serve" -d 'Serve an export as an NBD block device, in the foreground; TRIM erases at the next commit'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "mount" -d 'Mount the store as a file system (FUSE) in which rm, truncate and overwrite erase at the next commit'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "vault" -d 'Show the vault, change its password, or move the store to another vault'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "umount" -d 'Unmount a mounted store: commits, so that everything deleted is unrecoverable'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "certificate" -d 'Certificates of sanitization: check one (against the store too), show one as text or HTML'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "generate" -d 'Write the man pages and shell completions under DIR (as under /usr/local/share)'
complete -c oubli -n "__fish_oubli_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand init" -l cell-size -d 'Unit of encryption and erasure for data: a power of two from 4K to 1M (4K for a block device)' -r
complete -c oubli -n "__fish_oubli_using_subcommand init" -l key-scheme -d 'Where unit keys live: parent-pointer (each key in its parent), keyed-hash-forest (derived from a forest of roots, Lethe), key-storage-area (an array of key positions, DNEFS)' -r
complete -c oubli -n "__fish_oubli_using_subcommand init" -l kdf-memory -d 'Argon2id memory for the password key, in MiB' -r
complete -c oubli -n "__fish_oubli_using_subcommand init" -l kdf-iterations -d 'Argon2id passes for the password key' -r
complete -c oubli -n "__fish_oubli_using_subcommand init" -l nand-geometry -d 'Shape of the chip of a new `--store nand:IMAGE`: page size, pages per erase block, erase blocks and, optionally, out-of-band bytes per page' -r
complete -c oubli -n "__fish_oubli_using_subcommand init" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand init" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand init" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand init" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand init" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand init" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand put" -l share -d 'Place the data under this key share (destroying the share erases it)' -r
complete -c oubli -n "__fish_oubli_using_subcommand put" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand put" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand put" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand put" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand put" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand put" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand get" -l snapshot -d 'Read NAME as it was in this snapshot' -r
complete -c oubli -n "__fish_oubli_using_subcommand get" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand get" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand get" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand get" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand get" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand get" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l purge -d 'Commit at once, so that the data is unrecoverable when the command returns'
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l all-snapshots -d 'Also remove NAME (and its data) from every snapshot that holds it'
complete -c oubli -n "__fish_oubli_using_subcommand rm" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand rm" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l snapshot -d 'List the names of this snapshot' -r
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand ls" -s l -d 'Show size and modification time'
complete -c oubli -n "__fish_oubli_using_subcommand ls" -l json -d 'Print JSON (always with sizes and times)'
complete -c oubli -n "__fish_oubli_using_subcommand ls" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -f -a "create" -d 'Keep the whole store as it is now, read-only, in constant time'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -f -a "ls" -d 'List snapshots with the space each holds alone ("unique") and shares'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -f -a "rm" -d 'Remove a snapshot: what only it holds is erased at the next commit'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and not __fish_seen_subcommand_from create ls rm help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -l expire -d 'Remove the snapshot automatically after this long (e.g. 90m, 12h, 30d, 2w)' -r
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -l json -d 'Print JSON'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from ls" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l purge -d 'Commit at once, so that its data is unrecoverable when the command returns'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from rm" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "create" -d 'Keep the whole store as it is now, read-only, in constant time'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "ls" -d 'List snapshots with the space each holds alone ("unique") and shares'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "rm" -d 'Remove a snapshot: what only it holds is erased at the next commit'
complete -c oubli -n "__fish_oubli_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -f -a "create" -d 'Create a share whose key lives only in its own vault (a file, tpm:..., pkcs11:...)'
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -f -a "ls" -d 'List the shares, destroyed ones included'
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -f -a "destroy" -d 'Destroy a share\'s key: everything ever placed under it becomes unrecoverable, everywhere'
complete -c oubli -n "__fish_oubli_using_subcommand share; and not __fish_seen_subcommand_from create ls destroy help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -l share-vault -d 'Where the share\'s key is kept: a new file vault, a TPM index or a token (same password as the store)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -l json -d 'Print JSON'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from ls" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l yes -d 'Do not ask for confirmation'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from destroy" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from help" -f -a "create" -d 'Create a share whose key lives only in its own vault (a file, tpm:..., pkcs11:...)'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from help" -f -a "ls" -d 'List the shares, destroyed ones included'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from help" -f -a "destroy" -d 'Destroy a share\'s key: everything ever placed under it becomes unrecoverable, everywhere'
complete -c oubli -n "__fish_oubli_using_subcommand share; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l purge -d 'Commit at once, so that the data is unrecoverable when the command returns'
complete -c oubli -n "__fish_oubli_using_subcommand redact" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand redact" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand commit" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand commit" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand purge" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand purge" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand status" -l interval -d 'Seconds between refreshes of --watch' -r
complete -c oubli -n "__fish_oubli_using_subcommand status" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand status" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand status" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand status" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand status" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand status" -l json -d 'Print JSON'
complete -c oubli -n "__fish_oubli_using_subcommand status" -l watch -d 'Refresh every --interval seconds until interrupted (in place on a terminal), with the write rate'
complete -c oubli -n "__fish_oubli_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l threshold -d 'Clean segments whose live share is below this fraction' -r
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l purge-versions -d 'On a store in a versioned S3 bucket, also delete the old versions the bucket keeps of the store\'s objects (ciphertext under dead keys: only space is at stake)'
complete -c oubli -n "__fish_oubli_using_subcommand gc" -l consolidate-keys -d 'First re-seal the live data under fresh keys, so that a keyed hash forest fragmented by deletions shrinks back to few roots (reads and rewrites all live data; nothing to do under parent-pointer)'
complete -c oubli -n "__fish_oubli_using_subcommand gc" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l with-copy -d 'An old copy of the store directory the adversary also holds (backup, snapshot); repeatable' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l with-vault-copy -d 'An old copy of the vault file the adversary also holds; repeatable' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l fs -d 'Instead: list the blocks the file system on --export has free but the store still holds (exit 10 if any); the store must not be served' -r -f -a "ext4\t'ext4 (and ext2/ext3): block bitmaps'"
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l export -d 'The export whose file system --fs reads' -r
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l with-versions -d 'On S3: every version the bucket kept of every object of the store, as the provider holds them'
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l erase -d 'With --fs: drop those blocks at once (as a TRIM would) and commit'
complete -c oubli -n "__fish_oubli_using_subcommand audit" -l json -d 'Print JSON'
complete -c oubli -n "__fish_oubli_using_subcommand audit" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -l json -d 'Print JSON'
complete -c oubli -n "__fish_oubli_using_subcommand fsck" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l export -d 'The export to serve (created with --size if missing; also the default export)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l size -d 'Export size, e.g. 1G, 512M, 4096 (needed to create it; may grow it, never shrinks it)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l socket -d 'Listen on a Unix socket at PATH (mode 0600)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l listen -d 'Listen on TCP at HOST:PORT: needs --tls-certificates, or --tls=off on a loopback address' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l tls -d 'TLS: require (the default on TCP), on (for clients that ask), off (loopback TCP only). Applies to --socket too when given [default on --socket: off]' -r -f -a "require\t'Every client must start TLS and present a certificate from the CA'
on\t'TLS for clients that ask; others are served in the clear'
off\t'No TLS'"
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l tls-certificates -d 'Directory with ca-cert.pem, server-cert.pem and server-key.pem; clients must present a certificate signed by that CA (make them with scripts/nbd-certs, see docs/NBD.md)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l snapshot-every -d 'Take an automatic snapshot this often (e.g. 1h, 1d): named auto-YYYYMMDD-HHMMSS' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l metrics-file -d 'Write the store\'s figures in Prometheus\' text format to PATH at every commit' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l snapshot-keep -d 'Keep at most N automatic snapshots (the oldest are removed, and erased at the next commit)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l epoch-interval -d 'Commit at most this many seconds after a change (0: never on time)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l epoch-bytes -d 'Commit once this many bytes were written in the epoch (0: never on volume)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l epoch-deletions -d 'Commit after this many deletions (trims, overwrites...) in the epoch (0: never on count)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l infer-deletes -d 'Erase what the file system frees without TRIM: ext4 (follow its journal\'s committed block bitmaps), or off. Stored with the export: later runs keep it (docs/NBD.md, "Implicit deletes")' -r -f -a "ext4\t'ext4 with its internal jbd2 journal'
off\t'Only TRIM, discard and write-zeroes erase'"
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand serve" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand mount" -s o -d 'Mount options, comma-separated (repeatable): allow_other, default_permissions, ro, fsname=NAME, subtype=TYPE, epoch_interval=SECS, epoch_bytes=N, epoch_deletions=N, snapdir=visible|hidden, snapshot_every=DURATION, snapshot_keep=N, and kernel options such as noatime' -r
complete -c oubli -n "__fish_oubli_using_subcommand mount" -l metrics-file -d 'Write the store\'s figures in Prometheus\' text format to PATH at every commit' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand mount" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand mount" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand mount" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand mount" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand mount" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand mount" -s f -l foreground -d 'Stay in the foreground (default: detach once the file system is mounted)'
complete -c oubli -n "__fish_oubli_using_subcommand mount" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -f -a "show" -d 'Show the vault: kind, address, writes so far, endurance, projected lifetime'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -f -a "passwd" -d 'Change the vault password (file vault: in place; TPM or token: by moving to a new vault)'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -f -a "move" -d 'Move the store\'s epoch key to another vault, then destroy the old vault\'s key'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and not __fish_seen_subcommand_from show passwd move help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -l json -d 'Print JSON'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l to -d 'For a TPM or token vault: the new vault\'s address [default: the next NV index, or the object label with `.2` toggled]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l new-password-file -d 'Read the new password from the first line of FILE [else $OUBLI_NEW_PASSWORD, else asked]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l kdf-memory -d 'Argon2id memory for the new password key, in MiB [default: 64; passwd on a file vault: unchanged]' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l kdf-iterations -d 'Argon2id passes for the new password key [default: 3; passwd on a file vault: unchanged]' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from passwd" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l to -d 'The new vault\'s address: a file path, tpm:TCTI or a pkcs11: URI' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l new-password-file -d 'Read the new password from the first line of FILE [else $OUBLI_NEW_PASSWORD, else asked]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l kdf-memory -d 'Argon2id memory for the new password key, in MiB [default: 64; passwd on a file vault: unchanged]' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l kdf-iterations -d 'Argon2id passes for the new password key [default: 3; passwd on a file vault: unchanged]' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -l new-password -d 'Seal the new vault under a new password (asked, or --new-password-file / $OUBLI_NEW_PASSWORD) instead of the current one'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from move" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from help" -f -a "show" -d 'Show the vault: kind, address, writes so far, endurance, projected lifetime'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from help" -f -a "passwd" -d 'Change the vault password (file vault: in place; TPM or token: by moving to a new vault)'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from help" -f -a "move" -d 'Move the store\'s epoch key to another vault, then destroy the old vault\'s key'
complete -c oubli -n "__fish_oubli_using_subcommand vault; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l wait -d 'Seconds to wait for the mount process\'s final commit' -r
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l certificate -d 'Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l sign-key -d 'The organisation\'s Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand umount" -l hash-names -d 'In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)'
complete -c oubli -n "__fish_oubli_using_subcommand umount" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -f -a "verify" -d 'Check a certificate\'s signature and, with --store, that its erasure still holds (exit 10 if not)'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -f -a "show" -d 'Show a certificate as text, or as a printable HTML page'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and not __fish_seen_subcommand_from verify show help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -l public-key -d 'The organisation\'s Ed25519 public key (SPKI PEM, `openssl pkey -pubout`) the certificate must be signed by' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -l html -d 'A self-contained HTML page (print it, or save it as PDF from a browser)'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from help" -f -a "verify" -d 'Check a certificate\'s signature and, with --store, that its erasure still holds (exit 10 if not)'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from help" -f -a "show" -d 'Show a certificate as text, or as a printable HTML page'
complete -c oubli -n "__fish_oubli_using_subcommand certificate; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand generate" -l store -d 'The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand generate" -l vault -d 'The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand generate" -l password-file -d 'Read the vault password from the first line of FILE' -r -F
complete -c oubli -n "__fish_oubli_using_subcommand generate" -l on-vault-failure -d 'What mount and serve do when the vault cannot take a commit' -r -f -a "keep-open\t'Keep the epoch open, go on writing, retry the commit later'
refuse-writes\t'Refuse changes until a commit succeeds'"
complete -c oubli -n "__fish_oubli_using_subcommand generate" -l log-tally -d 'How often the intent log\'s tally catches up with its frames: `every-flush`, or SECONDS (mount and serve)' -r
complete -c oubli -n "__fish_oubli_using_subcommand generate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "init" -d 'Create a new store and its vault'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "put" -d 'Store data under NAME (replacing what NAME held), from SRC or stdin'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "get" -d 'Write the data stored under NAME to DST or stdout'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "rm" -d 'Remove NAME; its data is erased at the next commit (except from snapshots that hold it)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "ls" -d 'List the stored names'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "snapshot" -d 'Keep read-only versions of the whole store, list and remove them'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "share" -d 'Key shares: second secrets in their own vaults, destroyed out of band'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "redact" -d 'On a live mount: erase a file or directory from the store and from every snapshot'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "commit" -d 'End the epoch now: everything deleted so far becomes unrecoverable'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "status" -d 'Show the epoch, pending deletions, space and vault'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "gc" -d 'Reclaim space from segments that are mostly dead (commits)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "audit" -d 'Try to recover deleted data as an adversary would, and give a verdict (exit 10 on a leak)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "fsck" -d 'Read and authenticate everything in the store (exit 7 on problems)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "serve" -d 'Serve an export as an NBD block device, in the foreground; TRIM erases at the next commit'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "mount" -d 'Mount the store as a file system (FUSE) in which rm, truncate and overwrite erase at the next commit'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "vault" -d 'Show the vault, change its password, or move the store to another vault'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "umount" -d 'Unmount a mounted store: commits, so that everything deleted is unrecoverable'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "certificate" -d 'Certificates of sanitization: check one (against the store too), show one as text or HTML'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "generate" -d 'Write the man pages and shell completions under DIR (as under /usr/local/share)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and not __fish_seen_subcommand_from init put get rm ls snapshot share redact commit status gc audit fsck serve mount vault umount certificate generate help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from snapshot" -f -a "create" -d 'Keep the whole store as it is now, read-only, in constant time'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from snapshot" -f -a "ls" -d 'List snapshots with the space each holds alone ("unique") and shares'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from snapshot" -f -a "rm" -d 'Remove a snapshot: what only it holds is erased at the next commit'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from share" -f -a "create" -d 'Create a share whose key lives only in its own vault (a file, tpm:..., pkcs11:...)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from share" -f -a "ls" -d 'List the shares, destroyed ones included'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from share" -f -a "destroy" -d 'Destroy a share\'s key: everything ever placed under it becomes unrecoverable, everywhere'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from vault" -f -a "show" -d 'Show the vault: kind, address, writes so far, endurance, projected lifetime'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from vault" -f -a "passwd" -d 'Change the vault password (file vault: in place; TPM or token: by moving to a new vault)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from vault" -f -a "move" -d 'Move the store\'s epoch key to another vault, then destroy the old vault\'s key'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from certificate" -f -a "verify" -d 'Check a certificate\'s signature and, with --store, that its erasure still holds (exit 10 if not)'
complete -c oubli -n "__fish_oubli_using_subcommand help; and __fish_seen_subcommand_from certificate" -f -a "show" -d 'Show a certificate as text, or as a printable HTML page'
