sql = "SELECT role, COUNT(*) FROM messages WHERE session_id = ? GROUP BY role"
