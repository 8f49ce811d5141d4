package broker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Operator runs the broker in NATS operator mode: its users are JWTs (creds
// files) signed by an account the operator trusts, each carrying its
// permissions. MintCreds makes a creds file of a role.
type Operator struct {
	// OperatorJWT is the file of the trusted operator's JWT.
	OperatorJWT string
	// AccountJWT is the file of the JWT of the account gantry's users
	// belong to; its JetStream limits must allow JetStream.
	AccountJWT string
	// AccountSeed is the file of the account's seed (SA...): the broker
	// signs its in-process user with it.
	AccountSeed string
	// SystemAccountJWT is the file of the JWT of the operator's system
	// account, which JetStream needs.
	SystemAccountJWT string
}

// operatorOptions sets up operator mode: the trusted operator, the account
// in a memory resolver, and the in-process user, signed by the account.
func (b *Broker) operatorOptions(opts *server.Options) error {
	o := b.cfg.Operator
	op, err := server.ReadOperatorJWT(o.OperatorJWT)
	if err != nil {
		return fmt.Errorf("operator jwt: %w", err)
	}
	res := &server.MemAccResolver{}
	if _, err := storeAccount(res, o.AccountJWT); err != nil {
		return err
	}
	sys, err := storeAccount(res, o.SystemAccountJWT)
	if err != nil {
		return err
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{op}
	opts.AccountResolver = res
	opts.SystemAccount = sys
	// A role's JWT lists its subjects: its CONNECT is longer than the
	// default 4 KiB control line.
	opts.MaxControlLine = maxControlLine
	kp, err := readAccountSeed(o.AccountSeed)
	if err != nil {
		return err
	}
	b.internalJWT, b.internalSeed, err = mintUser(kp, internalUserName, nil, 0)
	return err
}

// maxControlLine bounds a protocol line in operator mode.
const maxControlLine = 64 << 10

// storeAccount puts the account JWT in file into res and returns the
// account's public key.
func storeAccount(res *server.MemAccResolver, file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("account jwt: %w", err)
	}
	token := strings.TrimSpace(string(data))
	acc, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return "", fmt.Errorf("account jwt %s: %w", file, err)
	}
	if err := res.Store(acc.Subject, token); err != nil {
		return "", fmt.Errorf("account jwt %s: %w", file, err)
	}
	return acc.Subject, nil
}

// readAccountSeed reads an account's key pair from its seed file.
func readAccountSeed(path string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("account seed: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("account seed %s: %w", path, err)
	}
	if pub, _ := kp.PublicKey(); !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("account seed %s: not an account seed (SA...)", path)
	}
	return kp, nil
}

// mintUser makes a user JWT named name, signed by account, with perms (nil:
// every right) and an expiry (0: none), and the user's seed.
func mintUser(account nkeys.KeyPair, name string, perms *Permissions, expires time.Duration) (string, []byte, error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	pub, err := user.PublicKey()
	if err != nil {
		return "", nil, err
	}
	seed, err := user.Seed()
	if err != nil {
		return "", nil, err
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	if expires > 0 {
		uc.Expires = time.Now().Add(expires).Unix()
	}
	if perms != nil {
		uc.Pub = jwt.Permission{Allow: perms.PublishAllow, Deny: perms.PublishDeny}
		uc.Sub = jwt.Permission{Allow: perms.SubscribeAllow, Deny: perms.SubscribeDeny}
		if perms.Responses {
			uc.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
		}
	}
	token, err := uc.Encode(account)
	if err != nil {
		return "", nil, fmt.Errorf("sign user %s: %w", name, err)
	}
	return token, seed, nil
}

// MintCreds returns a creds file (user JWT and seed) for a user named name
// of role r, signed by the account whose seed file is accountSeed, valid
// for expires (0: no expiry): what 'gantry role creds' writes, for a broker
// in operator mode.
func MintCreds(r Role, name, accountSeed string, expires time.Duration) ([]byte, error) {
	if name == "" {
		return nil, errors.New("a user needs a name")
	}
	perms, err := RolePermissions(r)
	if err != nil {
		return nil, err
	}
	kp, err := readAccountSeed(accountSeed)
	if err != nil {
		return nil, err
	}
	token, seed, err := mintUser(kp, name, &perms, expires)
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}
