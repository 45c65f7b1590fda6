package cli

import (
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/peer"
)

// Role is an agent's role in AgentStatus.Role, from what it reports.
func Role(info peer.NodeInfo) string {
	switch {
	case info.Member == nil:
		return RoleStandby
	case info.Member.Pending:
		return RolePending
	case info.Leader:
		return RoleLeader
	case info.IsLearner:
		return RoleLearner
	default:
		return RoleMember
	}
}

// AgentFromInfo is one agent's line of the status: what the agent at addr
// reported of itself.
func AgentFromInfo(addr string, info peer.NodeInfo) AgentStatus {
	a := AgentStatus{ID: info.NodeID, Address: addr, Role: Role(info), EtcdVersion: info.EtcdVersion, AgentVersion: info.AgentVersion,
		Healthy: info.EtcdHealthy, DBSize: info.DBSize, ClockOffset: info.MaxClockOffset, LockRefused: info.LockRefused,
		Procedure: info.Procedure, EtcdLeader: info.EtcdHealthy && info.MemberID != 0 && info.RaftLeader == info.MemberID,
		Cert: info.Cert, BackupKeys: info.BackupKeys, Trust: info.Trust, EtcdTrust: info.EtcdTrust, Transfer: info.Transfer}
	if len(info.ClientURLs) > 0 && info.Member != nil {
		a.ClientURL = info.ClientURLs[0]
	}
	if info.Member != nil {
		a.EtcdSettings = info.Member.Settings
	}
	if info.MemberID != 0 {
		a.MemberID = fmt.Sprintf("%x", info.MemberID)
		a.ClusterID = fmt.Sprintf("%x", info.ClusterID)
	}
	return a
}

// Add puts the agent at addr, which reported info, into the status; the
// manager leader's report also gives the cluster's failing changes,
// warnings and maintenance record.
func (st *ClusterStatus) Add(addr string, info peer.NodeInfo) {
	a := AgentFromInfo(addr, info)
	st.Agents = append(st.Agents, a)
	if a.EtcdLeader {
		st.EtcdLeader = a.ID
	}
	if info.Leader {
		st.Leader = info.NodeID
		st.Failing = info.Failing
		st.Warnings = info.Warnings
		st.Maintenance = info.Maintenance
	}
}
