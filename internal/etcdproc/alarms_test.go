package etcdproc

import (
	"context"
	"reflect"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// listedAlarms is an alarm list that records whether it was asked.
type listedAlarms struct {
	ids   []uint64
	alarm etcdserverpb.AlarmType
	asked bool
}

func (l *listedAlarms) AlarmList(context.Context) (*clientv3.AlarmResponse, error) {
	l.asked = true
	r := &clientv3.AlarmResponse{}
	for _, id := range l.ids {
		r.Alarms = append(r.Alarms, &etcdserverpb.AlarmMember{MemberID: id, Alarm: l.alarm})
	}
	return r, nil
}

func TestRaisedAlarms(t *testing.T) {
	nospace, corrupt := etcdserverpb.AlarmType_NOSPACE, etcdserverpb.AlarmType_CORRUPT
	tests := []struct {
		name      string
		alarm     etcdserverpb.AlarmType
		errs      [][]string
		wantIDs   []uint64
		wantKnown bool
		wantAsked bool
	}{
		{"no member answered", nospace, [][]string{nil, nil}, nil, false, false},
		{"no alarm", nospace, [][]string{{}, {}}, nil, true, false},
		{"one alarm, seen by every member", nospace, [][]string{{"memberID:1234 alarm:NOSPACE "}, {"memberID:1234 alarm:NOSPACE "}}, []uint64{1234}, true, false},
		{"two members' alarms", nospace, [][]string{{"memberID:1 alarm:NOSPACE ", "memberID:2  alarm:NOSPACE "}}, []uint64{1, 2}, true, false},
		{"another alarm only", nospace, [][]string{{"memberID:1 alarm:CORRUPT "}}, nil, true, false},
		{"NOSPACE in a form not parsed: the alarm list answers", nospace, [][]string{{"alarm NOSPACE on 77"}}, []uint64{77}, true, true},
		{"CORRUPT beside NOSPACE", corrupt, [][]string{{"memberID:1 alarm:NOSPACE ", "memberID:2 alarm:CORRUPT "}}, []uint64{2}, true, false},
		{"both in one error", corrupt, [][]string{{"memberID:1 alarm:NOSPACE memberID:2 alarm:CORRUPT"}}, []uint64{2}, true, false},
		{"CORRUPT in a form not parsed: the alarm list answers", corrupt, [][]string{{"CORRUPT"}}, []uint64{77}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &listedAlarms{ids: []uint64{77}, alarm: tt.alarm}
			ids, known := RaisedAlarms(context.Background(), l, tt.errs, tt.alarm)
			if !reflect.DeepEqual(ids, tt.wantIDs) || known != tt.wantKnown || l.asked != tt.wantAsked {
				t.Fatalf("ids %v known %v asked %v; want %v %v %v", ids, known, l.asked, tt.wantIDs, tt.wantKnown, tt.wantAsked)
			}
		})
	}
}
