package etcdproc

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// alarmRE finds an alarm among the errors of etcd's status
// ("memberID:<id> alarm:NOSPACE").
var alarmRE = regexp.MustCompile(`memberID:\s*(\d+)\s+alarm:\s*([A-Z]+)`)

// RaisedAlarms are the members with etcd's alarm raised, read from the
// errors of the members' status, which list the cluster's alarms; known
// is false when no member answered. (etcd's alarm list is a raft
// request: not something to send every cycle.) Only when a status names
// the alarm without a member does the alarm list answer.
func RaisedAlarms(ctx context.Context, c AlarmLister, statusErrs [][]string, alarm etcdserverpb.AlarmType) (ids []uint64, known bool) {
	name := alarm.String()
	mentioned := false
	for _, errs := range statusErrs {
		if errs != nil {
			known = true
		}
		for _, e := range errs {
			if !strings.Contains(e, name) {
				continue
			}
			mentioned = true
			for _, m := range alarmRE.FindAllStringSubmatch(e, -1) {
				if m[2] != name {
					continue
				}
				if id, err := strconv.ParseUint(m[1], 10, 64); err == nil && !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
		}
	}
	if !mentioned || len(ids) > 0 {
		return ids, known || len(ids) > 0
	}
	actx, cancel := context.WithTimeout(ctx, StatusTimeout)
	defer cancel()
	alarms, err := c.AlarmList(actx)
	if err != nil {
		return nil, false
	}
	for _, a := range alarms.Alarms {
		if a.Alarm == alarm {
			ids = append(ids, a.MemberID)
		}
	}
	return ids, true
}

// AlarmLister lists etcd's alarms.
type AlarmLister interface {
	AlarmList(ctx context.Context) (*clientv3.AlarmResponse, error)
}

// AlarmDisarmer disarms etcd's alarms.
type AlarmDisarmer interface {
	AlarmDisarm(ctx context.Context, m *clientv3.AlarmMember) (*clientv3.AlarmResponse, error)
}

// DisarmAlarms disarms the alarm of each member, within StatusTimeout in
// all.
func DisarmAlarms(ctx context.Context, c AlarmDisarmer, ids []uint64, alarm etcdserverpb.AlarmType) error {
	ctx, cancel := context.WithTimeout(ctx, StatusTimeout)
	defer cancel()
	for _, id := range ids {
		if _, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: alarm}); err != nil {
			return fmt.Errorf("etcdproc: disarm %s of member %x: %w", alarm, id, err)
		}
	}
	return nil
}
