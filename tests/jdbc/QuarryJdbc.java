// A JDBC client of `quarry server`, run by tests/python/test_flight_sql.py with the Arrow Flight
// SQL JDBC driver on the class path: `java QuarryJdbc.java JDBC_URL`. It prints what it read, a
// line per fact, for the test to compare with DuckDB.

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

public class QuarryJdbc {
    public static void main(String[] args) throws Exception {
        try (Connection con = DriverManager.getConnection(args[0])) {
            try (Statement st = con.createStatement();
                 ResultSet rs = st.executeQuery("select l_returnflag, l_linestatus, count(*) as n, sum(l_quantity) as q from lineitem group by 1, 2 order by 1, 2")) {
                while (rs.next()) {
                    System.out.println("group " + rs.getString(1) + " " + rs.getString(2) + " " + rs.getLong(3) + " " + rs.getBigDecimal(4).toPlainString());
                }
            }
            try (PreparedStatement ps = con.prepareStatement("select count(*) from orders where o_orderdate < ? and o_orderpriority = ?")) {
                for (String[] p : new String[][] {{"1995-01-01", "1-URGENT"}, {"1993-06-30", "5-LOW"}}) {
                    ps.setDate(1, java.sql.Date.valueOf(p[0]));
                    ps.setString(2, p[1]);
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        System.out.println("prepared " + p[0] + " " + p[1] + " " + rs.getLong(1));
                    }
                }
            }
            DatabaseMetaData meta = con.getMetaData();
            try (ResultSet rs = meta.getTables(null, null, "%", new String[] {"TABLE"})) {
                while (rs.next()) {
                    System.out.println("table " + rs.getString("TABLE_NAME"));
                }
            }
            try (ResultSet rs = meta.getColumns(null, null, "nation", null)) {
                while (rs.next()) {
                    System.out.println("column nation " + rs.getString("COLUMN_NAME"));
                }
            }
            // The driver keeps the server's session cookie: a setting holds for the connection.
            try (Statement st = con.createStatement()) {
                st.execute("set datafusion.execution.batch_size = 1234");
                try (ResultSet rs = st.executeQuery("select value from information_schema.df_settings where name = 'datafusion.execution.batch_size'")) {
                    rs.next();
                    System.out.println("setting " + rs.getString(1));
                }
            }
            try (Statement st = con.createStatement()) {
                st.executeQuery("select nope from nation");
                System.out.println("error none");
            } catch (SQLException e) {
                System.out.println("error " + e.getMessage().replace('\n', ' '));
            }
        }
    }
}
